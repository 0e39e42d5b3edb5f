"""Gradients of the operations built on sdpa, where training differentiates them: packed batches (sdpa_varlen,
grad.varlen) and multi-head attention with or without the variant keywords (multi_head_attention, grad.mha,
grad.mha-variants); docs/gradients.md derives them.

``op_gradients(impl, op, inputs, d_out, device)`` differentiates the implementation's own operation with its
framework's autodiff (the array adapter's ``vjp``, as conformance/judging/gradients.py does for sdpa): sdpa_varlen
with respect to the packed q, k, v and a learnable sink; multi_head_attention with respect to query, key, value,
every projection parameter and a learnable sink. Offsets, lengths, the mask, ALiBi slopes and every other keyword are
constants. ``analytic_gradients`` is the float64 backward of conformance/reference/backward.py on the same rounded
inputs, ``allowed_gradients`` the ``sdpa_backward`` model of spec/tolerances.yaml carried through the operation
(sequence by sequence; through the projections, sections sequence_gradients and mha_backward). ``judge_composed``
gives the verdict: the forward of the same call first, then each gradient, elements a row declared NaN reaches left
out (composed_unjudged).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from attention_conformance.conformance.cases.case import Case, widen
from attention_conformance.conformance.judging.gradient_verdicts import (
    GradientJudge,
    compare_gradients,
    gradients_or_verdict,
)
from attention_conformance.conformance.judging.gradients import backward_allowed
from attention_conformance.conformance.judging.messages import array_source, own_dtype
from attention_conformance.conformance.reference import backward as oracle_backward
from attention_conformance.conformance.reference import oracle
from attention_conformance.conformance.reference.output_forms import canonical_output, contract_output
from attention_conformance.conformance.reference.tolerances import (
    mha_context_allowed,
    model,
    smallest_normal,
    tf32_unit_roundoff,
    unit_roundoff,
)
from attention_conformance.implementations.arrays import ARRAY_KINDS, differentiable_kinds
from attention_conformance.implementations.contract import OPTIONAL_KEYWORDS, POSITIONAL, SCALAR_POSITIONAL

COMPOSED_OPS = ("sdpa_varlen", "multi_head_attention")


# The inputs each operation is differentiated with respect to (a learnable sink too, where given), and their
# gradients' names: dq, dk, dv of the packed arrays; dquery, dkey, dvalue and d + each parameter's name (dw_q, db_o).
DIFFERENTIATED = {"sdpa_varlen": ("q", "k", "v"), "multi_head_attention": ("query", "key", "value")}


def shared_inputs(op: str, inputs: dict) -> dict[str, str]:
    """{input: the earlier input it is}: a multi-head case's key or value equal to its query (or value to key) is one
    tensor passed twice, as self-attention passes x as query, key and value: training differentiates that tensor,
    whose gradient is the sum of the gradients of its uses (a self-attention layer may read it once)."""
    if op != "multi_head_attention":
        return {}
    shared: dict[str, str] = {}
    for later, earlier in (("key", "query"), ("value", "query"), ("value", "key")):
        a, b = np.asarray(inputs[later]), np.asarray(inputs[earlier])
        if later not in shared and a.shape == b.shape and np.array_equal(a, b):
            shared[later] = shared.get(earlier, earlier)
    return shared


def fold_shared(op: str, inputs: dict, grads: dict, combine=np.add) -> dict:
    """``grads`` (by gradient name) with each shared input's (shared_inputs) folded into the one it is, by
    ``combine`` (the sum of gradients or of allowances; logical or of unjudged elements)."""
    grads = dict(grads)
    for later, earlier in shared_inputs(op, inputs).items():
        if "d" + later in grads:
            grads["d" + earlier] = combine(grads["d" + earlier], grads.pop("d" + later))
    return grads


def differentiated(op: str, inputs: dict) -> list[str]:
    """The primals of ``op``'s case: its arrays (one per shared tensor, shared_inputs), "params.<name>" for each
    parameter, and the learnable sink."""
    shared = shared_inputs(op, inputs)
    names = [name for name in DIFFERENTIATED[op] if name not in shared]
    if op == "multi_head_attention":
        names += [f"params.{name}" for name in inputs["params"]]
    if inputs.get("learnable_sink") is not None:
        names.append("learnable_sink")
    return names


def gradient_name(name: str) -> str:
    """The gradient of primal ``name``: dq, dquery, dw_q (of params.w_q), dsink (of learnable_sink)."""
    if name == "learnable_sink":
        return "dsink"
    return "d" + name.split(".", 1)[-1]


def input_of(op: str, inputs: dict) -> dict[str, str]:
    """What each gradient is of, for the verdicts' words: {"dq": "q", "dw_q": "params['w_q']", ...}."""
    words = {gradient_name(n): (f"params[{n[7:]!r}]" if n.startswith("params.") else n) for n in
             differentiated(op, inputs)}
    shared = shared_inputs(op, inputs)
    for earlier in set(shared.values()):
        words["d" + earlier] += " (= " + " = ".join(n for n, e in shared.items() if e == earlier) + ": one tensor)"
    return words


def _differs(value, default) -> bool:
    if value is None or default is None:
        return value is not default
    return bool(value != default) if not isinstance(value, np.ndarray) else True


def op_gradients(impl, op: str, inputs: dict[str, Any], d_out: np.ndarray, device: str) -> dict:
    """Output and gradients of ``impl``'s ``op`` at ``inputs`` (rounded to the dtype) for upstream ``d_out`` (the
    output's contract shape): float64 NumPy arrays under "out" and each gradient's name (gradient_name), None where
    no gradient reached the input. Raises NotDifferentiable when the output carries none, and lets the
    implementation's own exceptions through. The call is the one Implementation.call_raw makes: the positional
    arguments, then the keywords that differ from their defaults."""
    kind = ARRAY_KINDS[impl.array]
    if not kind.DIFFERENTIABLE:
        raise ValueError(f"{impl.name}: gradients need an ARRAY whose adapter differentiates "
                         f"({', '.join(differentiable_kinds())}), not {impl.array!r}")
    names, shared = differentiated(op, inputs), shared_inputs(op, inputs)

    def native(value):
        return kind.to_native(np.asarray(value), device)

    primals = {name: native(inputs["params"][name[7:]] if name.startswith("params.") else inputs[name])
               for name in names}
    constants = {name: native(value) for name, value in inputs.items()
                 if isinstance(value, np.ndarray) and name not in names and name not in shared and name != "d_out"}

    def forward(**leaves):
        args = []
        for name in POSITIONAL[op]:
            if name in SCALAR_POSITIONAL:
                args.append(inputs[name])
            elif name == "params":
                args.append({key: leaves[f"params.{key}"] for key in inputs["params"]})
            else:
                name = shared.get(name, name)
                args.append(leaves[name] if name in leaves else constants[name])
        kwargs = {}
        for key, default in OPTIONAL_KEYWORDS[op].items():
            if key in leaves:
                kwargs[key] = leaves[key]
            elif _differs(inputs.get(key, default), default):
                kwargs[key] = constants.get(key, inputs.get(key))
        return impl.operation(op)(*args, **kwargs)

    with kind.precision(inputs):  # JAX: x64 for a float64 case only (implementations/arrays.py)
        out, grads = kind.vjp(forward, primals, np.asarray(d_out), device)
    result = {"out": canonical_output(op, _to_f64(kind, out))}
    for name in names:
        result[gradient_name(name)] = _to_f64(kind, grads.get(name))
    return result


def _to_f64(kind, value) -> np.ndarray | None:
    return None if value is None else np.asarray(kind.to_numpy(value)).astype(np.float64)


# ---------------------------------------------------------------- the analytic backward and its tolerance
def _mha_arguments(a: dict) -> tuple:
    return (a["query"], a["key"], a["value"], a["params"], a["num_heads"], a["d_out"], a.get("mask"),
            a.get("is_causal", False))


def analytic_gradients(op: str, inputs: dict, alignment: str = "bottom-right") -> dict[str, np.ndarray]:
    """The float64 analytic backward of ``op`` at the rounded ``inputs`` (conformance/reference/backward.py), by
    gradient name, a shared input's folded into the one it is (fold_shared)."""
    a = widen(inputs)
    if op == "sdpa_varlen":
        return oracle_backward.varlen_backward(a, a["d_out"], alignment)
    return fold_shared(op, a, oracle_backward.mha_backward(*_mha_arguments(a), **oracle.variant_options(a)))


def _sdpa_backward_constants() -> dict[str, float]:
    m = model()
    return {k: float(v) * m["safety_factor"] for k, v in m["sdpa_backward"].items() if k.startswith("c_")}


def varlen_allowed(inputs: dict, dtype: str, alignment: str = "bottom-right", tf32: bool = False,
                   constants: dict[str, float] | None = None) -> dict:
    """Allowed error of each gradient of an sdpa_varlen case (spec/tolerances.yaml, sequence_gradients): each
    sequence's allowance is its sdpa case's (backward_allowed), placed as its gradients are; a key past seqused_k
    or of a sequence without queries is exactly 0 (allowed 0); dsink's allowance sums the sequences'. ``constants``:
    backward_allowed's (the calibration's unit constants)."""
    a = widen(inputs)

    def per_sequence(one, d_out):
        return backward_allowed(one["q"], one["k"], one["v"], d_out, None, one["is_causal"], one["scale"], dtype,
                                constants, tf32=tf32, **oracle_backward.sequence_variants(one))

    return oracle_backward.varlen_backward(a, a["d_out"], alignment, per_sequence=per_sequence)


def mha_allowed_gradients(inputs: dict, dtype: str, tf32: bool = False,
                          constants: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """Allowed error of each gradient of a multi_head_attention case (spec/tolerances.yaml, mha_backward): the heads'
    sdpa backward with the forward's errors of their q, k, v (mha_context_allowed) and of their dO = split(dY W_o^T)
    as input errors (backward_allowed), then the chain rule's products, each an accumulation of n terms costing
    u (c_acc sqrt(n) + c_out) of its absolute values. ``constants``: the sdpa_backward constants (the calibration's
    unit ones; the forward's projection errors keep theirs)."""
    a = widen(inputs)
    query, key, value, params, heads, d_out, mask, is_causal = _mha_arguments(a)
    variants = oracle.variant_options(a)
    c = _sdpa_backward_constants() if constants is None else constants
    u = max(unit_roundoff(dtype), tf32_unit_roundoff()) if tf32 else unit_roundoff(dtype)
    final = c["c_out"] * smallest_normal(dtype)

    def rounding(n):
        return u * (c["c_acc"] * math.sqrt(n) + c["c_out"])

    trace: dict = {}
    oracle.multi_head_attention(query, key, value, params, heads, mask, is_causal, trace=trace, **variants)
    err_q, err_k, err_v, err_context = mha_context_allowed(query, key, value, params, heads, dtype, trace, tf32)
    w = {name: np.abs(x) for name, x in params.items()}
    dy, abs_dy = d_out, np.abs(d_out)
    rows = dy.shape[0] * dy.shape[1]
    # dY W_o^T, split into the heads' dO: one product of E_out terms each
    d_merged_err = rounding(dy.shape[-1]) * (abs_dy @ w["w_o"].T)
    split = oracle_backward.split_heads
    head_grads = oracle_backward.sdpa_backward(trace["q_heads"], trace["k_heads"], trace["v_heads"],
                                               split(dy @ params["w_o"].T, heads), mask, is_causal, None, **variants)
    head_allowed = backward_allowed(trace["q_heads"], trace["k_heads"], trace["v_heads"],
                                    split(dy @ params["w_o"].T, heads), mask, is_causal, None, dtype, constants,
                                    tf32=tf32,
                                    input_errors={"q": err_q, "k": err_k, "v": err_v,
                                                  "d_out": split(d_merged_err, heads)}, **variants)
    merged_err = oracle_backward.merge_heads(err_context)
    allowed = {"dw_o": np.einsum("bld,ble->de", merged_err, abs_dy)
               + rounding(rows) * np.einsum("bld,ble->de", np.abs(trace["merged"]), abs_dy) + final}
    if "b_o" in params:
        allowed["db_o"] = rounding(rows) * abs_dy.sum(axis=(0, 1)) + final
    for name, x in (("query", query), ("key", key), ("value", value)):
        n = name[0]
        d_projected = np.abs(oracle_backward.merge_heads(head_grads["d" + n]))
        d_projected_err = oracle_backward.merge_heads(head_allowed["d" + n])
        allowed["d" + name] = d_projected_err @ w["w_" + n].T + rounding(d_projected.shape[-1]) * (
            d_projected @ w["w_" + n].T) + final
        allowed["dw_" + n] = np.einsum("ble,bld->ed", np.abs(x), d_projected_err) + rounding(rows) * np.einsum(
            "ble,bld->ed", np.abs(x), d_projected) + final
        if "b_" + n in params:
            allowed["db_" + n] = d_projected_err.sum(axis=(0, 1)) + rounding(rows) * d_projected.sum(axis=(0, 1)) \
                + final
    if "dsink" in head_allowed:
        allowed["dsink"] = head_allowed["dsink"]
    return allowed


def allowed_gradients(op: str, inputs: dict, dtype: str, alignment: str = "bottom-right", tf32: bool = False,
                      constants: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """The allowed error of each gradient of an sdpa_varlen or multi_head_attention case (varlen_allowed,
    mha_allowed_gradients)."""
    if op == "sdpa_varlen":
        return varlen_allowed(inputs, dtype, alignment, tf32, constants)
    return fold_shared(op, inputs, mha_allowed_gradients(inputs, dtype, tf32, constants))


# ---------------------------------------------------------------- rows declared NaN
def composed_unjudged(judge, case: Case, inputs: dict, want: dict) -> dict[str, np.ndarray]:
    """The gradient elements a row declared "nan" (FULLY_MASKED_ROWS) can reach (True: not judged), as
    gradient_verdicts.nan_row_unjudged says for sdpa; {} without one. Such a row's weights are NaN and its dO 0,
    NaN * 0 is NaN, and a kernel of a packed batch may normalise over every packed key: sdpa_varlen's dq of the row,
    dk and dv of its kv head (every packed key), dsink of its head. multi_head_attention: the query rows with such a
    head row (dquery), the key and value rows of its batch entry (dkey, dvalue), every parameter (each sums over all
    rows), dsink of its head. Plus padding rows (i >= query_lengths[b]): their dquery."""
    unjudged: dict[str, np.ndarray] = {}
    if case.op == "multi_head_attention":
        return fold_shared(case.op, inputs, _mha_unjudged(judge, case, inputs, want), np.logical_or)
    rows = judge.declared_policy_rows(case, inputs) & (np.asarray(judge.policy(case, inputs)) == "nan")
    if not np.any(rows):
        return unjudged
    hq, hkv = want["dq"].shape[1], want["dk"].shape[1]
    rows = contract_output(case.op, np.broadcast_to(rows, (1, hq, want["dq"].shape[0])))  # (total_q, Hq)
    unjudged["dq"] = np.broadcast_to(rows[..., None], want["dq"].shape)
    kv_heads = rows.any(axis=0).reshape(hkv, hq // hkv).any(axis=-1)[None, :, None]
    unjudged["dk"] = np.broadcast_to(kv_heads, want["dk"].shape)
    unjudged["dv"] = np.broadcast_to(kv_heads, want["dv"].shape)
    if "dsink" in want:
        unjudged["dsink"] = rows.any(axis=0)
    return unjudged


def _mha_unjudged(judge, case: Case, inputs: dict, want: dict) -> dict[str, np.ndarray]:
    """composed_unjudged of a multi-head case, before a shared input's gradients are folded (shapes: the inputs')."""
    unjudged: dict[str, np.ndarray] = {}
    shape = {"d" + n: np.shape(inputs[n]) for n in ("query", "key", "value")}
    if inputs.get("query_lengths") is not None:
        unjudged["dquery"] = ~np.broadcast_to(judge.judged_rows(case, inputs), shape["dquery"])
    rows = oracle.mha_fully_masked_rows(inputs) & (np.asarray(judge.policy(case, inputs)) == "nan")
    if not np.any(rows):
        return unjudged
    b, lq = shape["dquery"][:2]
    rows = np.broadcast_to(rows, (b, inputs["num_heads"], lq))
    query_rows = np.swapaxes(rows.any(axis=1, keepdims=True), 1, 2)  # (B, Lq, 1)
    unjudged["dquery"] = np.broadcast_to(query_rows, shape["dquery"]) | unjudged.get("dquery", False)
    entries = rows.any(axis=(1, 2))[:, None, None]
    for name in ("dkey", "dvalue"):
        unjudged[name] = np.broadcast_to(entries, shape[name])
    for name in want:
        if name.startswith(("dw_", "db_")):
            unjudged[name] = np.ones(want[name].shape, dtype=bool)
    if "dsink" in want:
        unjudged["dsink"] = rows.any(axis=(0, 2))
    return unjudged


# ---------------------------------------------------------------- judging
class ComposedGradientJudge(GradientJudge):
    """A GradientJudge of sdpa_varlen and multi_head_attention cases: its repro snippet recomputes their gradients."""

    def _snippet(self, case: Case, inputs: dict, arrays_file: str | None = None) -> str:
        prelude, source = array_source(arrays_file, self.dtype)
        lines = [
            "import numpy as np, ml_dtypes",
            "from attention_conformance.implementations.registry import load_implementation",
            "from attention_conformance.conformance.judging.composed_gradients import analytic_gradients, "
            "op_gradients",
            *prelude,
            f"impl = load_implementation({self.impl.spec!r})",
        ]
        options = {}
        for name, value in inputs.items():
            if isinstance(value, np.ndarray):
                lines.append(f"{name} = {source(name, None, value, own_dtype(name, value, self.dtype))}")
            elif isinstance(value, dict):
                lines.append(f"{name} = {{" + ", ".join(f"{key!r}: {source(name, key, item, self.dtype)}"
                                                        for key, item in value.items()) + "}")
            else:
                options[name] = value
        arrays = [n for n, value in inputs.items() if isinstance(value, (np.ndarray, dict))]
        lines.append("inputs = {" + ", ".join(f"{n!r}: {n}" for n in arrays) + "".join(
            f", {k!r}: {v!r}" for k, v in options.items()) + "}")
        lines.append(f"got = op_gradients(impl, {case.op!r}, inputs, inputs['d_out'], device={self.device!r})")
        lines.append(f"want = analytic_gradients({case.op!r}, inputs, {self.alignment!r})")
        lines.append("for name in want: print(name, 'max abs error', 'none: no gradient reached it' if got.get(name) "
                     "is None else np.max(np.abs(got[name] - want[name]), initial=0.0))")
        return "\n".join(lines)

    def replay(self, case: Case) -> None:
        __tracebackhide__ = True
        judge_composed(self, case, case.rounded(self.dtype))


def forward_clause_of(case: Case) -> str:
    """The forward clause a composed gradient case's output is judged under first."""
    if case.op == "sdpa_varlen":
        return "varlen.variants" if oracle.variant_options(case.inputs) else "varlen.definition"
    return "mha.variants" if oracle.variant_options(case.inputs) else "mha.projections"


def _where(case: Case, inputs: dict):
    """How a verdict names a gradient element of a packed batch: the sequence and row it belongs to."""
    if case.op != "sdpa_varlen":
        return None
    spans = oracle.varlen_spans(inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], inputs.get("seqused_k"))
    starts_k = np.asarray(inputs["cu_seqlens_k"]).astype(np.int64)

    def where(name, index):
        token = int(index[0]) if len(index) == 3 else None
        if token is None:
            return f"{name} index {index}"
        if name == "dq":
            b = next(i for i, (qs, qe, _, _) in enumerate(spans) if qs <= token < qe)
            return f"{name} index {index} (sequence {b}, its query row {token - spans[b][0]})"
        b = int(np.searchsorted(starts_k, token, side="right") - 1)
        used = token < spans[b][3]
        return (f"{name} index {index} (sequence {b}, its key row {token - int(starts_k[b])}"
                f"{'' if used else ', past seqused_k: no query attends it'})")

    return where


def judge_composed(judge, case: Case, inputs: dict, order=None, blame=None) -> None:
    """The forward of the same call (forward_clause_of), then each gradient of ``order`` (all by default) against the
    analytic backward, under ``case.clauses[0]`` or ``blame(judge, case, inputs, name)``'s clause, with the elements
    composed_unjudged names left out."""
    __tracebackhide__ = True
    got = gradients_or_verdict(judge, case, inputs, obtain=lambda impl, a, d, device: op_gradients(
        impl, case.op, a, d, device))
    out = got["out"]
    if case.op == "sdpa_varlen":
        want_shape = (1, inputs["q"].shape[1], inputs["q"].shape[0], inputs["v"].shape[2])
    else:
        want_shape = inputs["query"].shape[:2] + (inputs["params"]["w_o"].shape[1],)
    if out.shape != tuple(want_shape):
        judge.run(Case(case.op, {n: x for n, x in case.inputs.items() if n != "d_out"}, case.clauses, case.label,
                       mask_kind=case.mask_kind), {n: x for n, x in inputs.items() if n != "d_out"})
        judge.fail(case.clauses[0], case, inputs, f"the output under autodiff has shape {out.shape}, expected "
                                                  f"{tuple(want_shape)} (the judge's form)")
    judge.judge(case, out, inputs, forward_clause_of(case))
    want = analytic_gradients(case.op, inputs, judge.alignment)
    allowed = allowed_gradients(case.op, inputs, judge.dtype, judge.alignment, judge.tf32)
    clauses = {name: case.clauses[0] for name in want}
    compare_gradients(judge, case, inputs, got, want, allowed, order or tuple(want),
                      blame or (lambda *_: (case.clauses[0], "")), clauses, composed_unjudged(judge, case, inputs, want),
                      input_of(case.op, inputs), _where(case, inputs),
                      "sequence_gradients" if case.op == "sdpa_varlen" else "mha_backward")


def composed_agrees(judge, case: Case, name: str) -> bool:
    """A diagnosis probe: whether the implementation's gradient ``name`` of ``case`` (rounded to the judge's dtype)
    agrees with the analytic backward; False when it cannot tell (raised, missing, wrong shape). Records nothing."""
    inputs = case.rounded(judge.dtype)
    try:
        got = judge.limited(case, op_gradients, judge.impl, case.op, inputs, inputs["d_out"], judge.device)
    except Exception:
        return False
    want = analytic_gradients(case.op, inputs, judge.alignment)
    if name not in want or got.get(name) is None or got[name].shape != want[name].shape:
        return False
    allowed = allowed_gradients(case.op, inputs, judge.dtype, judge.alignment, judge.tf32)
    unjudged = composed_unjudged(judge, case, inputs, want).get(name, False)
    error = np.abs(np.where(unjudged, want[name], got[name]) - want[name])
    return bool(np.all(error <= allowed[name]))

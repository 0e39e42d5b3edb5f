"""Judging gradients: the GradientJudge and the verdict on dq, dk, dv, dmask and dsink against the analytic
backward (clauses grad.*; docs/gradients.md), a GQA fault blamed on the head mapping where per-head gradients
agree.
"""
from __future__ import annotations

import numpy as np

from attention_conformance.conformance.cases.case import Case, widen
from attention_conformance.conformance.judging.containment import ImplementationHung
from attention_conformance.conformance.judging.gradients import backward_allowed, gradients
from attention_conformance.conformance.judging.messages import array_source, own_dtype
from attention_conformance.conformance.judging.verdict import Judge, exceeds_allowed
from attention_conformance.conformance.reference import backward as oracle_backward
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.arrays import NotDifferentiable

GRAD_CLAUSE = {"dq": "grad.sdpa-q", "dk": "grad.sdpa-k", "dv": "grad.sdpa-v", "dmask": "grad.mask",
               "dsink": "grad.learnable-sink"}


INPUT_OF = {"dq": "q", "dk": "k", "dv": "v", "dmask": "mask", "dsink": "learnable_sink"}


# ---------------------------------------------------------------- judging
class GradientJudge(Judge):
    """A Judge whose repro snippet recomputes the gradients."""

    def _snippet(self, case: Case, inputs: dict, arrays_file: str | None = None) -> str:
        prelude, source = array_source(arrays_file, self.dtype)
        lines = [
            "import numpy as np, ml_dtypes",
            "from attention_conformance.implementations.registry import load_implementation",
            "from attention_conformance.conformance.reference import oracle",
            "from attention_conformance.conformance.reference import backward as oracle_backward",
            "from attention_conformance.conformance.judging.gradients import gradients",
            *prelude,
            f"impl = load_implementation({self.impl.spec!r})",
        ]
        options = {}
        for name, value in inputs.items():
            if isinstance(value, np.ndarray):
                # Lengths (int32), ALiBi slopes and sink logits (float32/float64) keep their own dtype.
                lines.append(f"{name} = {source(name, None, value, own_dtype(name, value, self.dtype))}")
            else:
                options[name] = value
        arrays = [n for n, value in inputs.items() if isinstance(value, np.ndarray) and n != "d_out"]
        lines.append("inputs = {" + ", ".join(f"{n!r}: {n}" for n in arrays) + "".join(
            f", {k!r}: {v!r}" for k, v in options.items()) + "}")
        lines.append(f"got = gradients(impl, inputs, d_out, device={self.device!r})")
        lines.append("options = (inputs.get('mask'), inputs.get('is_causal', False), inputs.get('scale'))")
        lines.append("variants = oracle.variant_options(inputs)")
        lines.append("rows = oracle.judged_rows(q, inputs.get('query_lengths'))[..., None]  # padding rows: not judged")
        lines.append("print('out max abs error', np.max(np.where(rows, np.abs(got['out'] - oracle.sdpa(q, k, v, "
                     "*options, **variants)), 0.0)))")
        lines.append("want = oracle_backward.sdpa_backward(q, k, v, d_out, *options, **variants)")
        lines.append("for name in want: print(name, 'max abs error', 'none: no gradient reached it' if got.get(name) "
                     "is None else np.max(np.abs(got[name] - want[name])))")
        return "\n".join(lines)

    def replay(self, case: Case) -> None:
        __tracebackhide__ = True
        judge_gradients(self, case, case.rounded(self.dtype))


def gradients_or_verdict(judge: Judge, case: Case, inputs: dict, obtain=gradients) -> dict:
    """The implementation's output and gradients (``obtain(impl, inputs, d_out, device)``: sdpa's by default);
    unsupported cases are rejected, failures named."""
    __tracebackhide__ = True
    impl = judge.impl
    judge.require_support(case, inputs, case.op)
    raised = None
    try:
        return judge.limited(case, obtain, impl, inputs, inputs["d_out"], judge.device)
    except ImplementationHung as exc:  # past the call time limit (conformance/judging/verdict.py)
        judge.hung(case, inputs, exc)
    except NotImplementedError as exc:
        judge.not_implemented(case, exc)
    except NotDifferentiable as exc:
        raised = f"{case.op} is not differentiable with {impl.array} autodiff: {exc}"
    except Exception as exc:  # contained: this case fails, the session goes on
        raised = f"computing the gradients raised {type(exc).__name__}: {exc}"
        # The forward alone first: a forward that raises or returns the wrong shape fails its own clause
        # (sdpa.output-shape: a rank-3 mask read as (B, Lq, Lk) grew the batch, and autograd's "Mismatch in shape"
        # was filed under grad.sdpa-q).
        def forward(arrays: dict) -> dict:
            return {name: value for name, value in arrays.items() if name != "d_out"}

        judge.run(Case(case.op, forward(case.inputs), case.clauses, case.label, mask_kind=case.mask_kind,
                       notes=case.notes), forward(inputs))  # the very inputs the gradients got
    judge.fail(case.clauses[0], case, inputs, raised, raised=True)


def _expected(inputs: dict, judge: Judge):
    a = widen(inputs)
    args = (a["q"], a["k"], a["v"], a["d_out"], a.get("mask"), a.get("is_causal", False), a.get("scale"))
    variants = oracle.variant_options(a)
    return (oracle_backward.sdpa_backward(*args, **variants),
            backward_allowed(*args, judge.dtype, tf32=judge.tf32, **variants))


def worst_element(got: np.ndarray, want: np.ndarray, allowed: np.ndarray):
    """(error, error / allowed error, index of the worst element). A NaN or inf where the analytic backward is finite
    is the worst element whatever the allowance (no gradient check passes on one, even where the allowance itself
    came out NaN or inf)."""
    error = np.abs(got - want)
    error = np.where(np.isnan(error), np.inf, error)
    ratio = np.where(allowed > 0, error / np.where(allowed > 0, allowed, 1.0), np.where(error > 0, np.inf, 0.0))
    ratio = np.where(~np.isfinite(got) & np.isfinite(want), np.inf, ratio)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return error, ratio, worst


def gradient_agrees(judge: Judge, case: Case, inputs: dict, name: str) -> bool:
    """A diagnosis probe: whether the implementation's gradient ``name`` at ``inputs`` (rounded) agrees with the
    analytic backward; False when it cannot tell (raised, missing, wrong shape). Records nothing."""
    try:
        got = judge.limited(case, gradients, judge.impl, inputs, inputs["d_out"], judge.device)
    except Exception:
        return False
    want, allowed = _expected(inputs, judge)
    if got.get(name) is None or got[name].shape != want[name].shape:
        return False
    _, ratio, worst = worst_element(got[name], want[name], allowed[name])
    return bool(ratio[worst] <= 1.0)


def _per_head_gradients_agree(judge: Judge, case: Case, inputs: dict, name: str) -> bool:
    """GQA diagnosis: the gradient ``name`` with the kv heads repeated to Hq (no GQA) agrees with the oracle."""
    hq = inputs["q"].shape[1]
    expanded = dict(inputs, k=oracle.repeat_kv_heads(inputs["k"], hq).astype(inputs["k"].dtype),
                    v=oracle.repeat_kv_heads(inputs["v"], hq).astype(inputs["v"].dtype))
    return gradient_agrees(judge, case, expanded, name)


def gqa_blame(judge: Judge, case: Case, inputs: dict, name: str) -> tuple[str, str]:
    """(clause, note) for a gradient ``name`` beyond its tolerance: grad.gqa-sum when a grouped-query case's dK / dV
    agree with the oracle once the kv heads are repeated to Hq (no GQA), else the gradient's own clause."""
    clause, note = GRAD_CLAUSE[name], ""
    if name in ("dk", "dv") and inputs["q"].shape[1] > inputs["k"].shape[1]:
        group = inputs["q"].shape[1] // inputs["k"].shape[1]
        if _per_head_gradients_agree(judge, case, inputs, name):
            clause = "grad.gqa-sum"
            note = (f"; with the kv heads repeated to Hq (no GQA) {name} agrees, so the sum over the "
                    f"{group} query heads sharing each kv head is wrong")
        else:
            note = "; it also disagrees with the kv heads repeated to Hq (no GQA)"
    return clause, note


def judge_gradients(judge: Judge, case: Case, inputs: dict, order=("dq", "dk", "dv", "dmask", "dsink"),
                    forward_clause: str = "sdpa.definition", blame=gqa_blame) -> None:
    """Forward first (``forward_clause``), then each gradient in ``order`` against the analytic backward.

    A NaN or inf where the analytic backward is finite fails the gradient's clause (as a NaN or inf in the
    forward output fails sdpa.finite, in ``judge``). ``blame(judge, case, inputs, name)`` gives the clause and a note
    for a gradient beyond its tolerance: by default (gqa_blame) dK / dV failures of a grouped-query case name
    grad.gqa-sum when the per-head gradients (kv heads repeated to Hq) agree with the oracle. dq of padding rows
    (i >= query_lengths[b]) is not judged: their output is unspecified. Rows without a key take dO = 0
    (with_upstream_gradient), so their gradients are zero under "zeros" and "uniform"; under a declared "nan" only
    the gradients such a row can reach are left unjudged (nan_row_unjudged), every other one is judged.
    """
    __tracebackhide__ = True
    got = gradients_or_verdict(judge, case, inputs)
    judge.judge(case, got["out"], inputs, forward_clause)
    want, allowed = _expected(inputs, judge)
    unjudged = nan_row_unjudged(judge, case, inputs, want)
    if inputs.get("query_lengths") is not None:
        rows = ~np.broadcast_to(judge.judged_rows(case, inputs)[..., None], want["dq"].shape)
        unjudged["dq"] = rows | unjudged.get("dq", False)
    compare_gradients(judge, case, inputs, got, want, allowed, order, blame, GRAD_CLAUSE, unjudged)


def nan_row_unjudged(judge: Judge, case: Case, inputs: dict, want: dict) -> dict[str, np.ndarray]:
    """Of an sdpa case whose rows without a key are declared "nan" (FULLY_MASKED_ROWS), the gradient elements such a
    row can reach, by name (True: not judged); {} without one. Its dO is 0, but its weights are NaN, and NaN * 0 is
    NaN: dq of the row itself, dk and dv of every key of its kv head in its batch entry (P^T dO sums over the rows),
    the float mask's elements it is summed into, and the sink logit of its head. Everything else is judged."""
    rows = judge.declared_policy_rows(case, inputs) & (np.asarray(judge.policy(case, inputs)) == "nan")
    if not np.any(rows):
        return {}
    b, hq, lq = want["dq"].shape[:3]
    hkv = want["dk"].shape[1]
    rows = np.broadcast_to(rows, (b, hq, lq))
    heads = rows.any(axis=-1).reshape(b, hkv, hq // hkv).any(axis=-1)[..., None, None]  # (B, Hkv, 1, 1)
    unjudged = {"dq": np.broadcast_to(rows[..., None], want["dq"].shape),
                "dk": np.broadcast_to(heads, want["dk"].shape), "dv": np.broadcast_to(heads, want["dv"].shape)}
    if "dmask" in want:
        lk = want["dk"].shape[2]
        reached = oracle_backward.reduce_to_shape(np.broadcast_to(rows[..., None], (b, hq, lq, lk)).astype(float),
                                                  want["dmask"].shape)
        unjudged["dmask"] = np.broadcast_to(reached > 0, want["dmask"].shape)
    if "dsink" in want:
        unjudged["dsink"] = rows.any(axis=(0, 2))
    return unjudged


def compare_gradients(judge: Judge, case: Case, inputs: dict, got: dict, want: dict, allowed: dict, order, blame,
                      clauses: dict, unjudged: dict | None = None, input_of: dict | None = None,
                      where=None, tolerance: str = "sdpa_backward") -> None:
    """Each gradient of ``order`` (those ``want`` has) against the analytic one: missing, of the wrong shape, a NaN or
    inf where the analytic one is finite, or beyond its allowance fails, under ``clauses[name]`` (``blame(judge,
    case, inputs, name)`` gives the clause and a note of one beyond its allowance); else a pass is recorded under
    it. ``unjudged[name]``: elements not judged (True). ``input_of[name]``: the input it is the gradient of (INPUT_OF
    by default). ``where(name, index)``: words naming an element (its index by default). ``tolerance``: the section
    of spec/tolerances.yaml the allowances come from, for the verdict's words."""
    __tracebackhide__ = True
    input_of = INPUT_OF if input_of is None else input_of
    unjudged = {} if unjudged is None else unjudged
    for name in [n for n in order if n in want]:
        clause = clauses[name]
        if got.get(name) is None:
            judge.fail(clause, case, inputs, f"no gradient reached {input_of[name]} (its .grad / cotangent is None)")
        if got[name].shape != want[name].shape:
            judge.fail(clause, case, inputs, f"d{input_of[name]} has shape {got[name].shape}, expected "
                                             f"{want[name].shape} (the shape of {input_of[name]})")
        mine = got[name]
        if name in unjudged:
            mine = np.where(unjudged[name], want[name], mine)
        error, ratio, worst = worst_element(mine, want[name], allowed[name])
        if ratio[worst] > 1.0:
            clause, note = blame(judge, case, inputs, name)
            index = tuple(int(i) for i in worst)
            problem = f"{name} = dL/d{input_of[name]}: " + exceeds_allowed(
                error[worst], allowed[name][worst], ratio[worst], f"{judge.dtype} {tolerance} tolerance",
                float(error.max())) + note
            non_finite = ~np.isfinite(mine) & np.isfinite(want[name])
            if non_finite.any():
                index = tuple(int(i) for i in np.argwhere(non_finite)[0])
                problem = (f"{name} = dL/d{input_of[name]}: {int(non_finite.sum())} non-finite element(s) where the "
                           f"analytic backward is finite{note}")
            # The record carries the figures, so the report's plot shows the case above its line at 1.
            record = judge.new_record(case, clause, "failed", max_abs_error=float(error.max()),
                                      allowed=float(allowed[name][worst]), ratio=float(ratio[worst]))
            named = where(name, index) if where is not None else f"{name} index {index}"
            judge.fail(clause, case, inputs, problem,
                       f"{named}: got {mine[index]:.9g}, analytic backward {want[name][index]:.9g}",
                       record=record)
        judge.record(case, clause, "passed", max_abs_error=float(error.max()),
                     allowed=float(allowed[name][worst]), ratio=float(ratio[worst]))

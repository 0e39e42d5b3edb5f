"""ONNX's backend node tests for the ``Attention`` operator, mapped onto the sdpa contract.

ONNX ships no node-test data in its wheel, but it ships the generator that writes
that data: ``onnx.backend.test.case.node.attention`` (each ``export_*`` function is
run after ``np.random.seed(0)``, and its expected outputs come from ONNX's reference
implementation ``onnx/reference/ops/op_attention.py``). ``collect()`` runs that
generator, so the cases are byte for byte the ones ONNX writes to
``onnx/backend/test/data/node/test_attention_*`` for the installed version.

Each case is mapped onto the contract of docs/contract.md (sdpa with the
variant keywords), following op_attention.py (onnx 1.23.2):

* 3-D packed inputs (B, L, H*D) with q_num_heads/kv_num_heads are reshaped to
  (B, H, L, D), and Y back: a layout, not a semantic.
* ``scale``: ONNX multiplies Q and K each by sqrt(scale) rounded to Q's dtype; the
  product is scale * q.k, the contract's scale (the rounding is the tolerance's).
* ``past_key``/``past_value`` are concatenated in front of K/V; ONNX aligns the
  causal band and the window to the cache (query i sits at past_len + i), which is
  the contract's ``query_offset = past_len``.
* ``attn_mask`` shorter than the keys is padded with False / -inf (ONNX's rule),
  and given leading unit axes up to 4-D (right-aligned broadcasting, as ONNX has).
* ``nonpad_kv_seqlen`` (no cache) is ``key_lengths``; with is_causal or a window ONNX
  aligns each example's band to its own length (query i of example b at
  nonpad[b] - Lq + i). The contract's query_offset is one number, so such a case is
  split into one part per example (attention is independent per example), each
  with its own query_offset; a negative offset is outside the contract.
* ``softcap`` > 0 is applied to the scaled scores before any bias or mask (ONNX and
  the contract agree on the order); 0 means none in ONNX.
* ``left_window_size``/``right_window_size`` (-1 = unbounded) are the contract's
  ``window=(left, right)`` with None for -1: ONNX allows key j iff
  p - left <= j <= p + right, both edges inclusive, as the contract does.
* ``softmax_precision`` changes only ONNX's working precision, not the semantics.
* Only Y is judged: present_key/present_value (the concatenated cache) and
  qk_matmul_output (an intermediate) are not outputs of the contract; they are
  listed per case as ``unjudged``.

Run ``python -m attention_conformance.conformance.cases.onnx_attention`` to regenerate
``fixtures/onnx_attention.yaml`` and print the agreement table.
"""
from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from attention_conformance.conformance.specdata import ROOT

ONNX_REQUIREMENT = "onnx>=1.23"




FIXTURE_PATH = ROOT / "fixtures" / "onnx_attention.yaml"


# ONNX's backend runner holds every backend to these against the expected outputs
# (onnx.backend.test.case.node.expect: rtol 1e-3, atol 1e-7).
ONNX_RTOL, ONNX_ATOL = 1e-3, 1e-7


UNJUDGED_OUTPUTS = ("present_key", "present_value", "qk_matmul_output")


@dataclasses.dataclass
class Part:
    """One contract call: sdpa(**inputs) must give ``expected`` (4-D), rows ``batch`` of the ONNX case."""

    inputs: dict[str, Any]
    expected: np.ndarray
    batch: tuple[int, int]


@dataclasses.dataclass
class OnnxCase:
    name: str
    opset: int
    dtype: str
    attributes: dict[str, Any]
    parts: list[Part]
    reason: str | None = None  # why the case is outside the contract (then parts is empty)
    unjudged: tuple[str, ...] = ()

    @property
    def in_contract(self) -> bool:
        return self.reason is None


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _to_4d(x: np.ndarray, heads: int) -> np.ndarray:
    b, length, width = x.shape
    return np.swapaxes(x.reshape(b, length, heads, width // heads), 1, 2)


def map_case(name: str, opset: int, attributes: dict[str, Any], inputs: dict[str, np.ndarray],
             outputs: dict[str, np.ndarray]) -> OnnxCase:
    """The contract's reading of one ONNX Attention test (inputs/outputs by their ONNX names)."""
    a = dict(attributes)
    q, k, v = inputs["Q"], inputs["K"], inputs["V"]
    dtype = str(q.dtype)  # ml_dtypes' bfloat16 prints as bfloat16
    unjudged = tuple(n for n in UNJUDGED_OUTPUTS if n in outputs)
    case = OnnxCase(name, opset, dtype, a, [], unjudged=unjudged)
    if dtype not in ("float64", "float32", "float16", "bfloat16"):
        case.reason = f"input dtype {dtype} is not a dtype of the contract"
        return case
    y = _f64(outputs["Y"])
    q, k, v = _f64(q), _f64(k), _f64(v)
    if q.ndim == 3:
        q, k, v = _to_4d(q, a["q_num_heads"]), _to_4d(k, a["kv_num_heads"]), _to_4d(v, a["kv_num_heads"])
        y = _to_4d(y, a["q_num_heads"])
    past = inputs.get("past_key")
    nonpad = inputs.get("nonpad_kv_seqlen")
    if past is not None:
        k = np.concatenate([_f64(past), k], axis=2)
        v = np.concatenate([_f64(inputs["past_value"]), v], axis=2)
    b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
    call: dict[str, Any] = {"q": q, "k": k, "v": v}
    mask = inputs.get("attn_mask")
    if mask is not None:
        boolean = mask.dtype == np.bool_
        mask = mask if boolean else _f64(mask)
        if mask.shape[-1] < lk:  # ONNX pads a short mask over the remaining keys with False / -inf
            pad = [(0, 0)] * (mask.ndim - 1) + [(0, lk - mask.shape[-1])]
            mask = np.pad(mask, pad, constant_values=False if boolean else -np.inf)
        call["mask"] = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    if a.get("is_causal"):
        call["is_causal"] = True
    if "scale" in a:
        call["scale"] = float(a["scale"])
    if a.get("softcap", 0.0) > 0:
        call["softcap"] = float(a["softcap"])
    left, right = a.get("left_window_size", -1), a.get("right_window_size", -1)
    if left >= 0 or right >= 0:
        call["window"] = (left if left >= 0 else None, right if right >= 0 else None)
    positional = bool(a.get("is_causal")) or "window" in call
    if nonpad is None:
        offsets = [past.shape[2] if past is not None else 0] * b
    else:
        call["key_lengths"] = nonpad.astype(np.int32)
        offsets = [int(n) - lq for n in nonpad]
    if positional and min(offsets) < 0:
        case.reason = (f"nonpad_kv_seqlen {nonpad.tolist()} with Lq {lq} puts the queries at negative positions "
                       f"(ONNX offsets {offsets}); the contract's query_offset is >= 0")
        return case
    if not positional or len(set(offsets)) == 1:
        if positional and offsets[0]:
            call["query_offset"] = offsets[0]
        case.parts.append(Part(call, y, (0, b)))
        return case
    for i in range(b):  # one part per example: each has its own query_offset
        part = {n: (x[i:i + 1] if isinstance(x, np.ndarray) and x.ndim and x.shape[0] == b else x)
                for n, x in call.items()}
        if offsets[i]:
            part["query_offset"] = offsets[i]
        case.parts.append(Part(part, y[i:i + 1], (i, i + 1)))
    return case


def collect() -> list[OnnxCase]:
    """Every non-expanded ONNX node test of Attention, mapped (needs the onnx package)."""
    from onnx import helper
    from onnx.backend.test.case.node import collect_testcases

    # collect_testcases imports every operator's generator module; some compute overflowing casts on purpose.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        tests = collect_testcases("Attention")
    found = []
    for test in tests:
        if test.name.endswith("_expanded") or "_expanded_ver" in test.name:
            continue  # the same inputs and outputs through ONNX's function body
        node = test.model.graph.node[0]
        if node.op_type != "Attention":
            continue
        attributes = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        values_in, values_out = test.data_sets[0]
        ins = dict(zip([n for n in node.input if n], (_numpy(x) for x in values_in), strict=True))
        outs = dict(zip([n for n in node.output if n], (_numpy(x) for x in values_out), strict=True))
        opset = max(o.version for o in test.model.opset_import if o.domain in ("", "ai.onnx"))
        found.append(map_case(test.name, opset, attributes, ins, outs))
    return found


def _numpy(x) -> np.ndarray:
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(x) if isinstance(x, TensorProto) else np.asarray(x)


def onnx_version() -> str:
    import onnx

    return onnx.__version__


# ------------------------------------------------------------------ agreement
def removed_keys(inputs: dict[str, Any]) -> np.ndarray:
    """(B or 1, Hq or 1, Lq, Lk) boolean: keys the contract removes (causal band, window, key lengths, bool mask).

    Used for the tolerance model's terms only (which keys a row sums over); the
    values compared are the oracle's.
    """
    q, k = inputs["q"], inputs["k"]
    lq, lk = q.shape[2], k.shape[2]
    p = inputs.get("query_offset", 0) + np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    removed = np.zeros((1, 1, lq, lk), dtype=bool)
    if inputs.get("is_causal"):
        removed = removed | (j > p)
    left, right = inputs.get("window", (None, None))
    if left is not None:
        removed = removed | (j < p - left)
    if right is not None:
        removed = removed | (j > p + right)
    if "key_lengths" in inputs:
        removed = removed | (j[None, None] >= np.asarray(inputs["key_lengths"]).reshape(-1, 1, 1, 1))
    mask = inputs.get("mask")
    if mask is not None:
        removed = removed | (~mask if mask.dtype == np.bool_ else np.isneginf(mask))
    return removed


def allowance(part: Part, dtype: str) -> np.ndarray:
    """The suite's per-element allowance for the case's dtype (spec/tolerances.yaml), with the contract's key
    removal expressed as a -inf bias (plus the float mask). A softcap only shrinks the scores the model bounds
    by |q| |k| scale, so the plain model is an upper bound for it."""
    from attention_conformance.conformance.reference import tolerances

    x = part.inputs
    bias = np.where(removed_keys(x), -np.inf, 0.0)
    mask = x.get("mask")
    if mask is not None and mask.dtype != np.bool_:
        bias = bias + np.where(np.isneginf(mask), 0.0, mask)
    q = x["q"]
    bias = np.broadcast_to(bias, q.shape[:2] + bias.shape[2:])
    return tolerances.sdpa_allowed(x["q"], x["k"], x["v"], bias, False, x.get("scale"), dtype)


def oracle_output(part: Part) -> np.ndarray:
    from attention_conformance.conformance.reference import oracle

    return oracle.sdpa(**part.inputs)


def disagreement(case: OnnxCase) -> tuple[float, str | None]:
    """(worst error / allowance over the case, the first disagreement or None)."""
    worst = 0.0
    for part in case.parts:
        got = oracle_output(part)
        allowed = allowance(part, case.dtype)
        error = np.abs(got - part.expected)
        ratio = float(np.max(error / np.maximum(allowed, np.finfo(float).tiny)))
        worst = max(worst, ratio)
        bad = ~(error <= allowed)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            return worst, (f"{case.name} rows {part.batch}: oracle {got[index]:.9g}, ONNX {part.expected[index]:.9g} "
                           f"at {index}, error {error[index]:.3g} > allowed {allowed[index]:.3g} ({case.dtype})")
    return worst, None


# ------------------------------------------------------------------ fixtures
# The cases written as fixtures (every in-contract case is checked by tests/test_onnx_agreement.py when onnx is
# installed; these judge every implementation in every run): one or more per feature, the small ones where there is
# a choice, about 16,000 numbers in all. No part with a fully masked row: the printed zeros there are one of the
# policies an implementation may declare (FULLY_MASKED_ROWS), and a fixture's printed values bind every
# implementation; ONNX's fully-masked cases are judged against the oracle in tests/test_onnx_agreement.py.
FIXTURE_CASES = (
    "test_attention_3d_transpose_verification", "test_attention_4d_causal", "test_attention_4d_attn_mask_bool",
    "test_attention_4d_diff_heads_mask4d_padded_kv", "test_attention_4d_fp16", "test_attention_4d_attn_mask_3d_causal",
    "test_attention_4d_causal_bf16", "test_attention_4d_gqa_scaled", "test_attention_3d_diff_heads_sizes_attn_mask",
    "test_attention_4d_softcap", "test_attention_4d_softcap_neginf_mask", "test_attention_4d_softcap_neginf_mask_poison",
    "test_attention_4d_causal_with_past_and_present", "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal",
    "test_attention_4d_causal_nonpad_continued_prefill", "test_attention_4d_gqa_causal_nonpad_decode",
    "test_attention_4d_causal_nonpad_attn_mask_composition", "test_attention_4d_causal_nonpad_batch_prefill",
    "test_attention_4d_padded_kv_bf16", "test_attention_bidirectional_window", "test_attention_local_window",
    "test_attention_3d_local_window", "test_attention_local_window_with_past", "test_attention_local_window_ext_cache_rank2_mask",
    "test_attention_local_window_rank1_boolean_mask", "test_attention_4d_with_qk_matmul_softcap",
)


VARIANT_KEYWORDS = ("window", "softcap", "alibi_slopes", "query_offset", "query_lengths", "key_lengths")


def _shortest(x: float, dtype: str) -> float:
    """The shortest decimal that rounds back to the same value in the case's dtype (YAML reads it as float64)."""
    if not np.isfinite(x):
        return float(x)
    from attention_conformance.implementations.arrays import numpy_dtype

    kind = numpy_dtype(dtype).type
    target = kind(x)
    for digits in range(1, 18):
        y = float(f"{x:.{digits}g}")
        if kind(y) == target:
            return y
    return float(x)


def _literal(x: np.ndarray, dtype: str) -> Any:
    if x.dtype == np.bool_:
        return x.tolist()
    if x.dtype.kind in "iu":
        return x.tolist()
    return [_literal(r, dtype) for r in x] if x.ndim else _shortest(float(x), dtype)


def _clauses(part: Part) -> list[str]:
    x = part.inputs
    found = [c for c, used in (
        ("sdpa.window", "window" in x), ("sdpa.softcap", "softcap" in x),
        ("sdpa.query-offset", "query_offset" in x), ("sdpa.varlen", "key_lengths" in x),
    ) if used]
    mask = x.get("mask")
    if mask is not None:
        found.append("mask.bool-true-attends" if mask.dtype == np.bool_ else "mask.float-additive")
    if x.get("is_causal") and "query_offset" not in x:  # with an offset the band is sdpa.query-offset's
        found.append("causal.top-left")
    if x["q"].shape[1] != x["k"].shape[1]:
        found.append("sdpa.gqa-mapping")
    if x["v"].shape[-1] != x["k"].shape[-1]:
        found.append("sdpa.value-dim")
    if "scale" in x:
        found.append("sdpa.scale-explicit")
    return found + ["sdpa.definition"]


def fixture_entries(cases: list[OnnxCase], known_clauses: set[str], variants: bool) -> list[dict]:
    """Fixture entries (spec/schema/fixtures.schema.yaml) for FIXTURE_CASES: those using a variant keyword when
    ``variants``, the plain ones otherwise. Clauses not (yet) in spec/clauses.yaml are left out of the list."""
    by_name = {c.name: c for c in cases}
    entries = []
    for name in FIXTURE_CASES:
        case = by_name[name]
        for part in case.parts:
            if any(k in part.inputs for k in VARIANT_KEYWORDS) != variants:
                continue
            x = part.inputs
            if np.all(removed_keys(x), axis=-1).any():
                raise ValueError(f"{name}: a part with a fully masked row cannot be a fixture (see FIXTURE_CASES)")
            origin = allowance(part, case.dtype)
            f32 = allowance(part, "float32")
            atol = float(np.max(origin) + np.max(f32))
            atol = float(f"{atol * 1.05:.2g}")
            inputs = {n: (_literal(np.asarray(v), case.dtype) if isinstance(v, np.ndarray) else
                          list(v) if isinstance(v, tuple) else v) for n, v in x.items()}
            clauses = [c for c in _clauses(part) if c in known_clauses]
            notes = []
            if name.startswith("test_attention_3d"):
                notes.append("ONNX's 3-D packed inputs (B, L, H*D) reshaped to (B, H, L, D), Y likewise")
            if "past_key" in name or "with_past" in name:
                notes.append("past_key/past_value concatenated in front of K/V")
            if len(case.parts) > 1:
                notes.append(f"example {part.batch[0]} of the batch (ONNX aligns each example to its own "
                             "nonpad_kv_seqlen; the contract's query_offset is one number)")
            if case.unjudged:
                notes.append(f"ONNX's other outputs {list(case.unjudged)} are not part of the contract")
            entries.append({
                "id": fixture_id(name, part, len(case.parts)),
                "kind": "example",
                "op": "sdpa",
                "clauses": clauses,
                "source": f"onnx {onnx_version()} backend node test {name} (opset {case.opset}, {case.dtype}): "
                          "onnx/backend/test/case/node/attention.py after np.random.seed(0); Y from "
                          "onnx/reference/ops/op_attention.py",
                "description": "; ".join(notes) or "mapped one to one",
                "inputs": inputs,
                "expected": _literal(part.expected, case.dtype),
                "tolerance": {
                    "atol": atol, "rtol": 0,
                    "reason": f"ONNX's reference computed Y in {case.dtype}: its error is within the suite's "
                              f"{case.dtype} allowance (spec/tolerances.yaml, max {np.max(origin):.2g} here), and a "
                              f"float32 implementation's within the float32 one (max {np.max(f32):.2g}); atol is "
                              "their sum plus 5 %. Values are the shortest decimals that round back to ONNX's "
                              f"{case.dtype} tensors.",
                },
            })
    return entries


def write_fixtures(cases: list[OnnxCase], variants: bool) -> Path:
    import yaml

    from attention_conformance.conformance.specdata import clauses as spec_clauses

    path = FIXTURE_PATH if not variants else FIXTURE_PATH.with_name("onnx_attention_variants.yaml")
    document = {
        "document": f"onnx-{onnx_version()}/onnx/backend/test/case/node/attention.py",
        "title": f"ONNX {onnx_version()} backend node tests for Attention" + (" (variant keywords)" if variants else ""),
        "notes": "Written by python -m attention_conformance.conformance.cases.onnx_attention --write (the mapping onto "
                 "the contract is documented there). ONNX's generator seeds NumPy with 0 before each case, so these "
                 "are the tensors of onnx/backend/test/data/node/test_attention_*; every case is checked against "
                 "the oracle by tests/test_onnx_agreement.py.",
        "fixtures": fixture_entries(cases, set(spec_clauses()), variants),
    }
    header = ("# Generated by python -m attention_conformance.conformance.cases.onnx_attention --write; do not edit.\n"
              "# Format: spec/schema/fixtures.schema.yaml.\n")
    path.write_text(header + yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=120))
    return path


def fixture_id(name: str, part: Part, parts: int) -> str:
    stem = name.removeprefix("test_").replace("_", "-")
    return f"onnx-{stem}" + (f"-b{part.batch[0]}" if parts > 1 else "")


def main(argv: list[str]) -> int:
    """Print the agreement table; with --write (and --write-variants) rewrite the fixture files."""
    cases = collect()
    ok = 0
    for case in cases:
        if not case.in_contract:
            print(f"OUT  {case.name}: {case.reason}")
            continue
        worst, problem = disagreement(case)
        ok += problem is None
        print(f"{'OK  ' if problem is None else 'FAIL'} {case.name} [{case.dtype}] worst/allowed {worst:.3f}"
              + (f" unjudged {list(case.unjudged)}" if case.unjudged else "") + (f": {problem}" if problem else ""))
    in_contract = sum(c.in_contract for c in cases)
    print(f"onnx {onnx_version()}: {len(cases)} cases, {in_contract} in contract, {ok} agree")
    for flag, variants in (("--write", False), ("--write-variants", True)):
        if flag in argv:
            path = write_fixtures(cases, variants)
            print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0 if ok == in_contract else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

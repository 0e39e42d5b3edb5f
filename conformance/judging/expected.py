"""What a case should give: the oracle's output and the tolerance model's allowed error, by operation.

Both the verdict (judging.py) and the attribution's probes (attribution.py) ask these of a Case, and
what emptied each fully masked row (the cause its FULLY_MASKED_ROWS policy is looked up by);
they live apart from either so that neither module imports the other. Inputs are the case's
inputs already rounded to the dtype under test; they are widened to float64 (exactly) here, so the
oracle and the bound see the very values the implementation got.
"""
from __future__ import annotations

import numpy as np

from attention_conformance.conformance.cases.case import Case, widen
from attention_conformance.conformance.reference import oracle, tolerances
from attention_conformance.conformance.reference.output_forms import SEQUENCE_OPS, assemble
from attention_conformance.implementations.contract import FULLY_MASKED_CAUSES, mask_cause


# ------------------------------------------------------------ fully masked rows: cause and policy
def fully_masked_causes(empty: np.ndarray, lq: int, lk: int, mask=None, is_causal: bool = False, *, window=None,
                        query_offset=0, key_lengths=None, sink_token_length=0, **_values) -> np.ndarray:
    """What emptied each fully masked row: (B, Hq, Lq) cause names of FULLY_MASKED_CAUSES, "" where ``empty`` is False.

    A row is attributed to the first of key_lengths, window, causal, bool, float (in that order) that leaves it
    without a key on its own. A row that no single cause empties, only several together (a boolean mask keeping
    only keys the causal band removes, a float mask -inf on every key a window keeps, or a removal without a cause
    of its own), is attributed to the case's mask kind: "float" when the case has a float mask, "bool" otherwise.
    ``empty`` is the (B, Hq, Lq) fully masked rows; the other arguments are the case's (widened) inputs.
    """
    full = empty.shape + (lk,)
    case_kind = mask_cause(mask)
    causes = np.full(empty.shape, "", dtype=f"<U{max(len(c) for c in FULLY_MASKED_CAUSES)}")
    if not empty.any():
        return causes

    def keyless(allowed) -> np.ndarray:
        return ~np.broadcast_to(allowed, full).any(axis=-1)

    alone = {}
    if key_lengths is not None:
        alone["key_lengths"] = lambda: keyless(oracle.positions_allowed(lq, lk, key_lengths=key_lengths))
    if window is not None:
        sinks = {"sink_token_length": sink_token_length} if sink_token_length else {}
        alone["window"] = lambda: keyless(oracle.positions_allowed(lq, lk, window=window,
                                                                   query_offset=query_offset or 0, **sinks))
    if is_causal:
        alone["causal"] = lambda: keyless(oracle.positions_allowed(lq, lk, True, query_offset=query_offset or 0))
    if mask is not None and case_kind == "bool":
        alone["bool"] = lambda: keyless(np.asarray(mask))
    elif mask is not None:
        alone["float"] = lambda: ~np.broadcast_to(~np.isneginf(np.asarray(mask)), full).any(axis=-1)
    left = empty.copy()
    for cause in FULLY_MASKED_CAUSES:
        if cause in alone and left.any():
            hit = left & alone[cause]()
            causes[hit] = cause
            left &= ~hit
    causes[left] = case_kind
    return causes


def _by_row(policy: np.ndarray, values: dict[str, np.ndarray]) -> np.ndarray:
    """Each row (B, Hq, Lq) from the array computed under its own policy (``values`` by policy name)."""
    arrays = dict(zip(values, np.broadcast_arrays(*values.values())))
    rows = np.asarray(policy)[..., None]
    out = arrays.get("zeros", next(iter(arrays.values())))
    for name, array in arrays.items():
        out = np.where(rows == name, array, out)
    return out


def expected_output(case: Case, inputs: dict, policy="zeros", alignment: str = "bottom-right") -> np.ndarray:
    """The oracle's result on (rounded, widened) inputs. ``policy``: one FULLY_MASKED_ROWS policy for every fully
    masked row, or (B, Hq, Lq) policy names, one per row (Judge.policy). ``alignment``: the implementation's
    SEQUENCE_ALIGNMENT (sdpa_varlen and sdpa_paged; their results in the judge's form, ``canonical_output``)."""
    if not isinstance(policy, str) and case.op != "multi_head_attention":  # MHA picks per head, before the merge
        return _by_row(policy, {name: expected_output(case, inputs, str(name), alignment)
                                for name in np.unique(policy)})
    a = widen(inputs)
    if case.op in SEQUENCE_OPS:
        return assemble(case.op, [oracle.sdpa(fully_masked_rows_policy=policy, **one) if _has_queries(one)
                                  else _no_rows(one) for one in oracle.sequence_cases(case.op, a, alignment)])
    if case.op == "softmax":
        return oracle.softmax(a["x"], axis=a.get("axis", -1))
    if case.op == "sdpa":
        a = oracle.dequantized(a)  # 8-bit q, k, v times their descale factors (sdpa.fp8-descale)
        return oracle.sdpa(
            a["q"], a["k"], a["v"], a.get("mask"), a.get("is_causal", False), a.get("scale"),
            fully_masked_rows_policy=policy, **oracle.variant_options(a),
        )
    return oracle.multi_head_attention(
        a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"), a.get("is_causal", False),
        fully_masked_rows_policy=policy, **oracle.variant_options(a),
    )


def allowed_error(case: Case, inputs: dict, dtype: str, policy="zeros", tf32: bool = False,
                  alignment: str = "bottom-right", output_dtype: str | None = None) -> np.ndarray:
    """The tolerance model's allowed error; ``tf32``: float32 matmuls declared to run in TF32 (FLOAT32_MATMUL);
    ``policy`` and ``alignment`` as for expected_output; ``output_dtype``: the result's dtype where it is not
    ``dtype`` (an 8-bit case's FP8_OUTPUT_DTYPE). A packed or paged case's rows are the rows of its sequences' sdpa
    cases: each row's allowance is the sdpa model's for its own sequence (spec/tolerances.yaml, sequences)."""
    if not isinstance(policy, str) and case.op != "multi_head_attention":  # MHA's bound covers every policy
        return _by_row(policy, {name: allowed_error(case, inputs, dtype, str(name), tf32, alignment, output_dtype)
                                for name in np.unique(policy)})
    a = widen(inputs)
    if case.op in SEQUENCE_OPS:
        pieces = []
        for one in oracle.sequence_cases(case.op, a, alignment):
            shape = one["q"].shape[:3] + (one["v"].shape[3],)
            if not _has_queries(one):
                pieces.append(np.zeros(shape))
                continue
            q, k, v, mask, is_causal, scale = (one.pop(n) for n in ("q", "k", "v", "mask", "is_causal", "scale"))
            pieces.append(np.broadcast_to(tolerances.sdpa_allowed(q, k, v, mask, is_causal, scale, dtype, policy,
                                                                  tf32=tf32, **one), shape))
        return assemble(case.op, pieces)
    if case.op == "softmax":
        return tolerances.softmax_allowed(a["x"], a.get("axis", -1), dtype)
    if case.op == "sdpa":
        a = oracle.dequantized(a)  # the 8-bit model (spec/tolerances.yaml, eight_bit) sees the dequantized values
        return tolerances.sdpa_allowed(
            a["q"], a["k"], a["v"], a.get("mask"), a.get("is_causal", False), a.get("scale"), dtype, policy, tf32=tf32,
            output_dtype=output_dtype, **oracle.variant_options(a),
        )
    return tolerances.mha_allowed(
        a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"), a.get("is_causal", False), dtype,
        tf32=tf32, **oracle.variant_options(a),
    )


def _has_queries(one: dict) -> bool:
    return one["q"].shape[2] > 0


def _no_rows(one: dict) -> np.ndarray:
    return np.zeros(one["q"].shape[:3] + (one["v"].shape[3],))


def sequence_fully_masked_rows(op: str, inputs: dict, alignment: str = "bottom-right") -> np.ndarray:
    """(1, Hq, total_q) or (B, Hq, Lq) boolean: the rows of a packed or paged case that have no key."""
    a = widen(inputs)
    pieces = []
    for one in oracle.sequence_cases(op, a, alignment):
        q, k = one.pop("q"), one.pop("k")
        one.pop("v"), one.pop("scale"), one.pop("softcap", None), one.pop("alibi_slopes", None)
        pieces.append(oracle.fully_masked_rows(q, k, **one) if _has_queries({"q": q})
                      else np.zeros(q.shape[:3], dtype=bool))
    return assemble(op, pieces)


def sequence_row_causes(op: str, inputs: dict, empty: np.ndarray, alignment: str = "bottom-right") -> np.ndarray:
    """What emptied each fully masked row of a packed or paged case (fully_masked_causes, sequence by sequence): a
    sequence without keys (none packed, seqused_k 0) is "key_lengths"; the band and the window are their own."""
    a = widen(inputs)
    pieces, row = [], 0
    for one in oracle.sequence_cases(op, a, alignment):
        lq, lk = one["q"].shape[2], one["k"].shape[2]
        if op == "sdpa_varlen":
            rows = empty[:, :, row:row + lq]
            row += lq
        else:
            rows = empty[len(pieces):len(pieces) + 1]
        causes = fully_masked_causes(rows, lq, lk, None, one["is_causal"], **{
            name: one[name] for name in ("window", "query_offset", "key_lengths") if name in one})
        pieces.append(causes)
    return assemble(op, pieces)

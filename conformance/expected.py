"""What a case should give: the oracle's output and the tolerance model's allowed error, by operation.

Both the verdict (judging.py) and the attribution's probes (attribution.py) ask these of a Case, and
what emptied each fully masked row (the cause its FULLY_MASKED_ROWS policy is looked up by);
they live apart from either so that neither module imports the other. Inputs are the case's
inputs already rounded to the dtype under test; they are widened to float64 (exactly) here, so the
oracle and the bound see the very values the implementation got.
"""
from __future__ import annotations

import numpy as np

from attention_conformance.implementations._registry import FULLY_MASKED_CAUSES, mask_cause

from . import oracle, tolerances
from .cases import Case, widen


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


def expected_output(case: Case, inputs: dict, policy="zeros") -> np.ndarray:
    """The oracle's result on (rounded, widened) inputs. ``policy``: one FULLY_MASKED_ROWS policy for every fully
    masked row, or (B, Hq, Lq) policy names, one per row (Judge.policy)."""
    if not isinstance(policy, str):
        return _by_row(policy, {name: expected_output(case, inputs, str(name)) for name in np.unique(policy)})
    a = widen(inputs)
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
        fully_masked_rows_policy=policy,
    )


def allowed_error(case: Case, inputs: dict, dtype: str, policy="zeros", tf32: bool = False,
                  output_dtype: str | None = None) -> np.ndarray:
    """The tolerance model's allowed error; ``tf32``: float32 matmuls declared to run in TF32 (FLOAT32_MATMUL);
    ``policy`` as for expected_output; ``output_dtype``: the result's dtype where it is not ``dtype`` (an 8-bit
    case's FP8_OUTPUT_DTYPE)."""
    if not isinstance(policy, str):
        return _by_row(policy, {name: allowed_error(case, inputs, dtype, str(name), tf32, output_dtype)
                                for name in np.unique(policy)})
    a = widen(inputs)
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
        tf32=tf32,
    )

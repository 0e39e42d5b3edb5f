"""The allowed error of merge_states (spec/tolerances.yaml, merge_states), from the exact merge of the parts given.

The merge's own arithmetic, not the parts': the oracle merges the very parts the implementation got (their out
rounded to the dtype, their lse to float32), so the allowance covers what a correct merge does to them in its
float32 accumulator (float64 in float64 cases), at once or one part at a time: each part's weight exp(lse_p - m) / Z computed from rounded
exponents (|lse_p| + |m|, a base converted, the shift) and a sum of P + 1 terms, the weighted sum of the parts'
outputs (one at a time, ring attention's sigmoid update: u |out_p| a step whatever the part weighs), and the result
rounded to the output dtype (below the normal range, a subnormal flushed to zero); the merged lse, m + log Z, rounded in the accumulator and to
float32.
"""
from __future__ import annotations

import numpy as np

from attention_conformance.conformance.reference.tolerances import is_sixteen_bit, model, unit_roundoff


def _constants() -> dict:
    m = model()
    return {k: float(v) * m["safety_factor"] for k, v in m["merge_states"].items() if k.startswith("c_")}


def _underflow(dtype: str) -> float:
    """The absolute error of a value below ``dtype``'s normal range: its smallest normal number where a kernel may
    flush subnormals to zero (float32 and float64: XLA's CPU code and GPU kernels built with fast math do), the
    subnormal spacing in 16 bits (conversions to them keep subnormals)."""
    import ml_dtypes

    from attention_conformance.implementations.arrays import numpy_dtype

    info = ml_dtypes.finfo(numpy_dtype(dtype))
    return float(info.smallest_subnormal if is_sixteen_bit(dtype) else info.tiny)


def merge_allowed(out, lse, merged_out, merged_lse, weights, dtype: str, learnable_sink=None) -> tuple[np.ndarray,
                                                                                                       np.ndarray]:
    """(allowed error of out (B, Hq, Lq, Dv), of lse (B, Hq, Lq)) of the merge of the P states ``out`` (P, B, Hq,
    Lq, Dv), ``lse`` (P, B, Hq, Lq) natural logs, whose exact merge is (merged_out, merged_lse, weights)
    (merging.merge_states). Rows without any key (merged lse -inf) are exact."""
    from attention_conformance.conformance.reference.merging import sink_column

    c = _constants()
    u_acc = unit_roundoff("float64") if dtype == "float64" else unit_roundoff("float32")
    u_out, u_lse = unit_roundoff(dtype), unit_roundoff("float32")
    out, lse = np.asarray(out, dtype=np.float64), np.asarray(lse, dtype=np.float64)
    parts = lse.shape[0]
    top = np.max(lse, axis=0)
    sink = sink_column(learnable_sink, top.shape)
    if sink is not None:
        top = np.maximum(top, sink)
    top = np.where(np.isfinite(top), np.abs(top), 0.0)
    exponent = np.where(np.isfinite(lse), np.abs(lse), 0.0) + top + parts + 3  # relative error of each weight / u
    spread = np.sum(weights[..., None] * np.abs(out) * exponent[..., None], axis=0)
    # A running update (ring attention's out - sigmoid(lse_b - lse) (out - out_b)) errs by u (|out| + |out_b|) at
    # each step, however little the parts weigh: u sum_p |out_p| over the parts with keys.
    running = np.sum(np.where(np.isfinite(lse)[..., None], np.abs(out), 0.0), axis=0)
    # Below the normal range a weight keeps only absolute precision, or is flushed to zero: each of the P + 3 steps
    # may lose the accumulator's smallest normal times the largest part; the result's rounding its dtype's.
    largest = np.max(np.abs(out), axis=0)
    tiny = (parts + 3) * _underflow("float64" if dtype == "float64" else "float32") * largest + _underflow(dtype)
    out_allowed = c["c_weights"] * u_acc * spread + c["c_running"] * u_acc * running \
        + c["c_out"] * (u_out * np.abs(merged_out) + tiny)
    lse_allowed = c["c_lse"] * u_acc * (top + parts + 3) \
        + c["c_out"] * u_lse * np.where(np.isfinite(merged_lse), np.abs(merged_lse), 0.0)
    empty = ~np.isfinite(merged_lse)
    return np.where(empty[..., None], 0.0, out_allowed), np.where(empty, 0.0, lse_allowed)

"""Broken: with a mask, removed keys are held at their score minus 65504 (float16's largest), not at -inf.

What torch's cuDNN attention does in float16 (H100 and H200, torch 2.11+cu130; benchmarks/score_range_probe.py,
README "GPU"): the suite's failing case is reproduced to its largest error by any finite fill from -1e4 to -65504.
With unit scores the fill is as good as -inf; where one row's scaled scores span more than 65504 (an outlier channel
at Dk 8: +-3.5e4) a removed key outweighs the kept ones. The causal band without a mask stays -inf (cuDNN's own).
"""
import numpy as np

from zoo import _reference as ref

BUG = "an explicit mask's removed keys (the causal band folded in) held at score - 65504 instead of -inf"
SOURCE = "torch 2.11+cu130 SDPA, cuDNN backend, float16 (measured on an H100 and an H200, 2026-11-27)"
# On the CPU's small shapes the fill bites a row without keys (it averages v); at Dk 8 an outlier channel's row too.
EXPECTED_CLAUSES = frozenset({"mask.fully-masked-row", "sdpa.score-range"})
DTYPES = ("float16",)
FILL = -65504.0


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    ref.check_qkv(q, k, v)
    k_rep, v_rep = ref.expand_kv(ref.as64(k), ref.as64(v), q.shape[1])
    scale = ref.default_scale(q.shape[-1]) if scale is None else float(scale)
    scores = ref.as64(q) @ np.swapaxes(k_rep, -1, -2) * scale
    bias = np.broadcast_to(ref.build_bias(mask, is_causal, q.shape[-2], k.shape[-2]), scores.shape)
    if mask is not None and np.dtype(mask.dtype) == np.bool_:
        bias = np.where(np.isneginf(bias), FILL, bias)  # BUG: finite, so a key scoring 65504 above the rest wins
    with np.errstate(invalid="ignore"):
        weights = ref.masked_softmax(scores + bias, axis=-1)
    return (weights @ v_rep).astype(ref.out_dtype(q))

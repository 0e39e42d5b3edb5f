"""Broken: declares float32/float64 but computes everything in float16."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa declares float32 (and float64) support but silently casts q, k, v to "
       "float16 and computes scores, softmax and output in float16 before casting "
       "back, losing about 3 decimal digits.")
SOURCE = "known bug class (silent precision loss)"
EXPECTED_CLAUSES = frozenset({"sdpa.definition"})
DTYPES = ("float32", "float64")


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    # BUG: float16 instead of float64 (as64) working precision
    q16, k16, v16 = (np.asarray(a).astype(np.float16) for a in (q, k, v))
    ref.check_qkv(q16, k16, v16)
    k16, v16 = ref.expand_kv(k16, v16, q16.shape[1])
    if scale is None:
        scale = ref.default_scale(q16.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):
        scores = (q16 @ np.swapaxes(k16, -1, -2)) * np.float16(scale)
        bias = ref.build_bias(mask, is_causal, q16.shape[-2], k16.shape[-2]).astype(np.float16)
        weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
        return (weights @ v16).astype(ref.out_dtype(q))

"""Broken: with is_causal=True the explicit mask is dropped."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa uses only the causal mask when is_causal=True and silently ignores the "
       "explicit mask, instead of intersecting the two.")
SOURCE = "zoo extra: if/else between causal and explicit mask"
EXPECTED_CLAUSES = frozenset({"causal.top-left"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    if is_causal:
        bias = ref.causal_bias(q64.shape[-2], k64.shape[-2])  # BUG: mask not combined
    else:
        bias = ref.mask_bias(mask)
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

"""Broken: the mask is applied to batch element 0 only."""
import numpy as np

from zoo import _reference as ref

BUG = "sdpa broadcasts the mask to (B, Hq, Lq, Lk) but then applies it only to the first batch element."
SOURCE = "known bug class (mask broadcasting over the batch)"
EXPECTED_CLAUSES = frozenset({"mask.broadcast"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = np.broadcast_to(ref.mask_bias(mask), scores.shape).copy()
    bias[1:] = 0.0  # BUG: batch elements 1.. are left unmasked
    if is_causal:
        bias = bias + ref.causal_bias(q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

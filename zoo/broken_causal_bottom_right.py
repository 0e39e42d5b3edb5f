"""Broken: is_causal aligned bottom-right (j <= i + Lk - Lq) instead of top-left."""
import numpy as np

from zoo import _reference as ref

BUG = ("is_causal is bottom-right aligned (j <= i + Lk - Lq, FlashAttention >= 2.1 "
       "convention) instead of top-left; differs only when Lq != Lk.")
SOURCE = "known bug class (flash-attention README: causal=True is bottom-right since v2.1)"
EXPECTED_CLAUSES = frozenset({"causal.top-left", "causal.bottom-right-explicit"})


def causal_bias(lq, lk):
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    return np.where(j <= i + (lk - lq), 0.0, -np.inf)  # BUG: reference keeps j <= i


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.mask_bias(mask)
    if is_causal:
        bias = bias + causal_bias(q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

"""Broken: a key padding mask (..., 1, Lk) is applied along the query axis."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa swaps the last two axes of a mask whose query axis is 1, so a key padding "
       "mask (B, 1, 1, Lk) is applied as (B, 1, Lk, 1): it masks queries instead of "
       "keys (and fails to broadcast when Lq != Lk).")
SOURCE = ("known bug class; 003_58636e0047490b73.txt 'Masks and Softmax' "
          "(source mask reshaped to (batch size, 1, 1, sequence length))")
EXPECTED_CLAUSES = frozenset({"mask.broadcast"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.ndim >= 2 and mask.shape[-2] == 1 and mask.shape[-1] != 1:
            mask = np.swapaxes(mask, -1, -2)  # BUG: (.., 1, Lk) read as (.., Lk, 1)
    bias = ref.build_bias(mask, is_causal, q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

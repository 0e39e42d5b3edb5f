"""Correct (declared deviation): fully masked rows give NaN, declared as such.

The plain stable softmax without a guard: an all -inf row computes
exp(-inf - (-inf)) = NaN, as torch.softmax does. The member declares it.
"""
import math

import numpy as np

BUG = "none"
SOURCE = "torch.softmax on an all -inf row (NaN); declared FULLY_MASKED_ROWS = 'nan'"
EXPECTED_CLAUSES = frozenset()
FULLY_MASKED_ROWS = "nan"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    dtype = np.asarray(q).dtype
    q, k, v = (np.asarray(a).astype(np.float64) for a in (q, k, v))
    hq, hkv, lq, lk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    if hkv == 0 or hq % hkv or v.shape[1] != hkv:
        raise ValueError("incompatible q/k/v shapes")
    k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q @ np.swapaxes(k, -1, -2)) * float(scale)
    if mask is not None:
        m = np.asarray(mask)
        s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + m.astype(np.float64)
    if is_causal:
        s = np.where(np.tril(np.ones((lq, lk), dtype=bool)), s, -np.inf)
    s = np.broadcast_to(s, (q.shape[0], hq, lq, lk))
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))  # NaN on all -inf rows
        w = e / e.sum(axis=-1, keepdims=True)
    return (w @ v).astype(dtype)

"""Correct: sdpa as an explicit Python loop over (batch, head), float64 inside.

Shares no code with zoo/_reference.py: each (b, h) pair is a plain 2-D problem,
the kv head is picked by index and the mask is broadcast once and sliced.
"""
import math

import numpy as np

BUG = "none"
SOURCE = "per-(batch, head) loop, the textbook formulation (000_ef9a8195ca3d79bb.txt 'Weighted Average')"
EXPECTED_CLAUSES = frozenset()


def _row_softmax(s):
    """Row-wise stable softmax of a 2-D float64 array; all -inf rows give zeros."""
    out = np.zeros_like(s)
    for i in range(s.shape[0]):
        row = s[i]
        mx = row.max() if row.size else -np.inf
        if mx == -np.inf:
            continue  # fully masked row stays zero
        e = np.exp(row - mx)
        out[i] = e / e.sum()
    return out


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    dtype = np.asarray(q).dtype
    q, k, v = (np.asarray(a).astype(np.float64) for a in (q, k, v))
    b, hq, lq, dk = q.shape
    hkv, lk, dv = v.shape[1], v.shape[2], v.shape[3]
    if k.shape != (b, hkv, lk, dk) or v.shape[0] != b or hkv == 0 or hq % hkv:
        raise ValueError("incompatible q/k/v shapes")
    group = hq // hkv
    if scale is None:
        scale = 1.0 / math.sqrt(dk)
    full_mask = None if mask is None else np.broadcast_to(np.asarray(mask), (b, hq, lq, lk))
    out = np.zeros((b, hq, lq, dv))
    for bi in range(b):
        for h in range(hq):
            kvh = h // group
            s = (q[bi, h] @ k[bi, kvh].T) * float(scale)
            if full_mask is not None:
                mh = full_mask[bi, h]
                if mh.dtype == np.bool_:
                    s = np.where(mh, s, -np.inf)
                else:
                    s = s + mh.astype(np.float64)
            if is_causal:
                for i in range(lq):
                    s[i, i + 1:] = -np.inf
            out[bi, h] = _row_softmax(s) @ v[bi, kvh]
    return out.astype(dtype)

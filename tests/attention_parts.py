"""NumPy attention pieces the stand-ins of the self-checks build their conventions from."""
from __future__ import annotations

import math

import numpy as np


def attention_parts(q, k, v, mask, is_causal, scale, window=None, query_offset=0, key_lengths=None, causal_shift=0):
    """Scores with the float mask added (float64), the keys each query keeps, v per query head, and the rows the window
    alone empties. ``causal_shift``: a stand-in's causal band off by that many keys."""
    q, k, v = (np.asarray(a).astype(np.float64) for a in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    lq, lk = q.shape[2], k.shape[2]
    s = q @ np.swapaxes(k, -1, -2) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale))
    keep = np.ones(s.shape, dtype=bool)
    if mask is not None and np.asarray(mask).dtype == np.bool_:
        keep &= np.asarray(mask)
    elif mask is not None:
        s = s + np.asarray(mask).astype(np.float64)
    position, key = query_offset + np.arange(lq)[:, None], np.arange(lk)[None, :]
    if is_causal:
        keep &= key <= position + causal_shift
    window_keep = np.ones((lq, lk), dtype=bool)
    if window is not None:
        left, right = window
        window_keep &= (key >= position - left) if left is not None else True
        window_keep &= (key <= position + right) if right is not None else True
        keep &= window_keep
    if key_lengths is not None:
        keep &= key[None, None] < np.asarray(key_lengths).reshape(-1, 1, 1, 1)
    return s, keep, v, ~window_keep.any(axis=-1)

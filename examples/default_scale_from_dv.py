"""An sdpa whose default scale is 1/sqrt(Dv) instead of 1/sqrt(Dk): wrong whenever Dv != Dk and
no scale is passed. Its failures are blamed on sdpa.scale-default, whichever property drew the case."""
import numpy as np


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    scale = v.shape[-1] ** -0.5 if scale is None else scale   # BUG: Dv, not Dk
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, 1).astype(np.float64), np.repeat(v, g, 1).astype(np.float64)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    if is_causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    w = np.exp(s - np.nan_to_num(s.max(-1, keepdims=True), neginf=0))
    w = w / np.where(w.sum(-1, keepdims=True) == 0, 1, w.sum(-1, keepdims=True))
    return (w @ v).astype(q.dtype)

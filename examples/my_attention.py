import numpy as np


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    g = q.shape[1] // k.shape[1]; s = q @ np.swapaxes(np.repeat(k, g, 1), -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    s = np.where(mask, s, -np.inf) if mask is not None and mask.dtype == bool else s + (0 if mask is None else mask)
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf) if is_causal else s
    w = np.exp(s - np.nan_to_num(s.max(-1, keepdims=True), neginf=0)); w = w / np.where(w.sum(-1, keepdims=True) == 0, 1, w.sum(-1, keepdims=True))
    return (w @ np.repeat(v, g, 1)).astype(q.dtype)

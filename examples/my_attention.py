import numpy as np

def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    s = np.where(mask, s, -np.inf) if mask is not None and mask.dtype == bool else s + (0 if mask is None else mask)
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf) if is_causal else s
    w = np.exp(s - np.max(s, -1, keepdims=True, initial=-1e300)); w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
    return (w @ np.repeat(v, q.shape[1] // v.shape[1], axis=1)).astype(q.dtype)

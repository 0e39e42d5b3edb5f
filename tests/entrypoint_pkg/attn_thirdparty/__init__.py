"""A third-party NumPy SDPA, found by attention-conformance through its entry point.

The logic is examples/my_attention.py's, with the key heads repeated as well as the
value heads (grouped-query attention) and a row maximum that cannot overflow in
float32, so that it passes every clause it is tested against.
"""
import numpy as np

NAME = "thirdparty_sdpa"
DTYPES = ("float32", "float64")


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    group = q.shape[1] // k.shape[1]  # Hq / Hkv: query head h uses kv head h // group
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    s = np.where(mask, s, -np.inf) if mask is not None and mask.dtype == bool else s + (0 if mask is None else mask)
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf) if is_causal else s
    top = np.max(s, -1, keepdims=True)
    w = np.exp(s - np.where(np.isfinite(top), top, 0))  # a fully masked row stays all zeros
    total = w.sum(-1, keepdims=True)
    return ((w / np.where(total > 0, total, 1)) @ v).astype(q.dtype)

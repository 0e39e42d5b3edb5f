"""Correct (declared deviation): fully masked rows give the mean of v, like jax.

Follows jax.nn.dot_product_attention's xla path: masked logits (bool mask,
causal, and -inf entries of a float mask) are replaced by a large finite
negative number, -0.7 * finfo(float64).max, before a stable softmax. A row that
is entirely masked thus becomes uniform and yields the mean of v over all keys,
which this member declares.
"""
import math

import numpy as np

BUG = "none"
SOURCE = "jax.nn.dot_product_attention (large negative fill; fully masked row -> mean of v)"
EXPECTED_CLAUSES = frozenset()
FULLY_MASKED_ROWS = "uniform"

LARGE_NEGATIVE = -0.7 * np.finfo(np.float64).max


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    dtype = np.asarray(q).dtype
    q, k, v = (np.asarray(a).astype(np.float64) for a in (q, k, v))
    b, hq, lq, dk = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    if hkv == 0 or hq % hkv or v.shape[1] != hkv:
        raise ValueError("incompatible q/k/v shapes")
    k, v = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    if scale is None:
        scale = 1.0 / math.sqrt(dk)
    logits = (q @ np.swapaxes(k, -1, -2)) * float(scale)
    keep = np.ones((b, hq, lq, lk), dtype=bool)
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            keep &= np.broadcast_to(m, keep.shape)
        else:
            logits = logits + np.broadcast_to(m.astype(np.float64), keep.shape)
    if is_causal:
        keep &= np.tril(np.ones((lq, lk), dtype=bool))
    keep &= ~np.isneginf(logits)
    logits = np.where(keep, logits, LARGE_NEGATIVE)
    logits = logits - logits.max(axis=-1, keepdims=True)
    w = np.exp(logits)
    w /= w.sum(axis=-1, keepdims=True)
    return (w @ v).astype(dtype)

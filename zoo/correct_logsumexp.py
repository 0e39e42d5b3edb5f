"""Correct: softmax and sdpa in log-sum-exp form, float64 inside.

softmax(x) = exp(x - logsumexp(x)), logsumexp(x) = max + log(sum(exp(x - max))).
A slice that is entirely -inf has logsumexp -inf and yields zeros.
"""
import math

import numpy as np

BUG = "none"
SOURCE = "log-sum-exp identity (scipy.special.softmax / logsumexp)"
EXPECTED_CLAUSES = frozenset()


def logsumexp(z, axis=-1):
    mx = np.max(z, axis=axis, keepdims=True, initial=-np.inf)
    finite_mx = np.where(np.isfinite(mx), mx, 0.0)
    with np.errstate(divide="ignore"):  # log(0) = -inf for fully masked slices
        return finite_mx + np.log(np.sum(np.exp(z - finite_mx), axis=axis, keepdims=True))


def _softmax64(z, axis=-1):
    lse = logsumexp(z, axis=axis)
    dead = np.isneginf(lse)
    return np.where(dead, 0.0, np.exp(z - np.where(dead, 0.0, lse)))


def softmax(x, axis=-1):
    x = np.asarray(x)
    return _softmax64(x.astype(np.float64), axis=axis).astype(x.dtype)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    dtype = np.asarray(q).dtype
    q, k, v = (np.asarray(a).astype(np.float64) for a in (q, k, v))
    hq, hkv, lq, lk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    if hkv == 0 or hq % hkv or v.shape[1] != hkv or k.shape[-1] != q.shape[-1]:
        raise ValueError("incompatible q/k/v shapes")
    # query head h -> kv head h // (hq // hkv)
    idx = np.arange(hq) // (hq // hkv)
    k, v = k[:, idx], v[:, idx]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    logits = np.einsum("bhqd,bhkd->bhqk", q, k) * float(scale)
    if mask is not None:
        m = np.asarray(mask)
        logits = (np.where(m, logits, -np.inf) if m.dtype == np.bool_
                  else logits + m.astype(np.float64))
    if is_causal:
        logits = np.where(np.tril(np.ones((lq, lk), dtype=bool)), logits, -np.inf)
    logits = np.broadcast_to(logits, (q.shape[0], hq, lq, lk))
    return np.einsum("bhqk,bhkd->bhqd", _softmax64(logits), v).astype(dtype)

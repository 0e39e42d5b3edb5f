"""Correct: blockwise online-softmax sdpa (FlashAttention-style), all four dtypes.

Keys are visited in blocks of BLOCK; each query row keeps a running maximum m,
a running normaliser l and an unnormalised accumulator acc, rescaled by
exp(m_old - m_new) whenever the maximum grows. The full score matrix is never
formed. Working precision: float32 for float16 / bfloat16 / float32 inputs,
float64 for float64. GQA is done by grouping query heads (no kv copies).
``tiled`` is the body, its tiling a parameter (query blocks, all rows by default), and
under is_causal the key loop of a query block stops after the block holding the key
of its last row (the blocks past it are above the band). Broken members call it with
one argument changed.
"""
import math

import numpy as np

BUG = "none"
SOURCE = "FlashAttention online softmax (Dao et al. 2022, Milakov & Gimelshein 2018)"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32", "float16", "bfloat16")

BLOCK = 3


def _work_dtype(x):
    return np.float64 if np.asarray(x).dtype == np.float64 else np.float32


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return tiled(q, k, v, mask, is_causal, scale)


def tiled(q, k, v, mask=None, is_causal=False, scale=None, *, key_block=BLOCK, query_block=None,
          running_max_start=-np.inf, causal_stop_row=lambda first, last: last):
    """sdpa, query blocks of ``query_block`` rows (None: all) and key blocks of ``key_block``; the running
    maximum starts at ``running_max_start``; under is_causal a query block's key loop ends after the key
    ``causal_stop_row(first row, last row)``."""
    out_dtype = np.asarray(q).dtype
    wd = _work_dtype(q)
    q, k, v = (np.asarray(a).astype(wd) for a in (q, k, v))
    b, hq, lq, dk = q.shape
    _, hkv, lk, dv = v.shape
    if k.shape[:3] != (b, hkv, lk) or k.shape[-1] != dk or hkv == 0 or hq % hkv:
        raise ValueError("incompatible q/k/v shapes")
    g = hq // hkv
    if scale is None:
        scale = 1.0 / math.sqrt(dk)
    scale = wd(scale)

    # Additive bias, broadcast view (B, Hq, Lq, Lk) split as (B, Hkv, G, Lq, Lk).
    bias = np.zeros((), wd)
    if mask is not None:
        m = np.asarray(mask)
        bias = np.where(m, wd(0), wd(-np.inf)) if m.dtype == np.bool_ else m.astype(wd)
    if is_causal:
        rows = np.arange(lq)[:, None]
        bias = bias + np.where(np.arange(lk)[None, :] <= rows, wd(0), wd(-np.inf))
    bias = np.broadcast_to(bias, (b, hq, lq, lk)).reshape(b, hkv, g, lq, lk)

    qg = q.reshape(b, hkv, g, lq, dk)  # query head h = kv * g + j  ->  kv = h // g
    out = np.zeros((b, hkv, g, lq, dv), wd)
    step = query_block or max(lq, 1)
    for first in range(0, lq, step):
        last = min(first + step, lq) - 1
        rows, n = slice(first, last + 1), last + 1 - first
        m_run = np.full((b, hkv, g, n, 1), running_max_start, wd)
        l_run = np.zeros((b, hkv, g, n, 1), wd)
        acc = np.zeros((b, hkv, g, n, dv), wd)
        for start in range(0, lk, key_block):
            if is_causal and start > causal_stop_row(first, last):
                break  # every later key block is above the causal band of these rows
            stop = min(start + key_block, lk)
            kb = k[:, :, None, start:stop, :]  # (B, Hkv, 1, blk, Dk)
            vb = v[:, :, None, start:stop, :]
            s = (qg[..., rows, :] @ np.swapaxes(kb, -1, -2)) * scale + bias[..., rows, start:stop]
            m_new = np.maximum(m_run, s.max(axis=-1, keepdims=True))
            m_safe = np.where(np.isneginf(m_new), wd(0), m_new)  # rows masked so far
            p = np.exp(s - m_safe)
            alpha = np.exp(m_run - m_safe)  # exp(-inf) = 0 on the first block
            l_run = l_run * alpha + p.sum(axis=-1, keepdims=True)
            acc = acc * alpha + p @ vb
            m_run = m_new
        out[..., rows, :] = np.divide(acc, l_run, out=np.zeros_like(acc), where=l_run > 0)
    return out.reshape(b, hq, lq, dv).astype(out_dtype)

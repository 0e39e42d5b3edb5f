"""Correct: a tiled online-softmax sdpa with the variant keywords, tiled as a GPU kernel tiles (queries 128, keys 64).

Query blocks of QUERY_BLOCK rows, key blocks of KEY_BLOCK keys. Under is_causal a query block's key loop ends after
the key of its last row, and a key block wholly below the causal band of the block (every key at or before the
block's first row) is an *interior* block: it skips the causal test, and only that. ALiBi is -slope * |p - j| at
the query's position p = query_offset + i; key_lengths masks keys j >= key_lengths[b] in every key block; the
learnable sink joins each row's normaliser once, after the key loop. A decode call (Lq 1) against more than
SPLIT_KEYS keys runs split-KV: partial (max, sum, accumulator) per split of SPLIT_KEYS keys, combined by their
maxima, then the sink. Working precision float32 (float64 for float64 inputs).

``tiled`` is the body; its hooks are what tiled kernels get wrong past their first block, and the broken members
``broken_tiled_*`` are ``with_hooks`` with one hook changed (bugs of independently written tiled kernels that
small corners miss: each needs a query past row 128 or a cache past 128 keys).
"""
from __future__ import annotations

import math

import numpy as np

BUG = "none"
SOURCE = "zoo extra: FlashAttention-2's forward tiling (Dao 2023) with flash-decoding's split-KV combine"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32", "float16", "bfloat16")

QUERY_BLOCK, KEY_BLOCK, SPLIT_KEYS = 128, 64, 128


def _alibi_rows(first: int, last: int, query_offset: int) -> np.ndarray:
    """The positions ALiBi measures each row of a query block from."""
    return query_offset + np.arange(first, last + 1)


def _lengths_in_block(start: int, stop: int, lk: int) -> bool:
    """Whether a key block applies key_lengths (every block does)."""
    return True


def _sink_in_split_decode(sink_term: np.ndarray) -> np.ndarray:
    return sink_term


def _interior_keeps_mask(bias_block: np.ndarray) -> np.ndarray:
    return bias_block


def with_hooks(**hooks):
    """The contract's sdpa over ``tiled`` with these hooks (a broken member's one change)."""

    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None):
        # query_lengths only marks padding rows, which the contract leaves unspecified: every row is computed.
        return tiled(q, k, v, mask, is_causal, scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                     query_offset=query_offset, key_lengths=key_lengths, learnable_sink=learnable_sink, **hooks)

    return sdpa


sdpa = with_hooks()


def tiled(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
          query_offset=0, key_lengths=None, learnable_sink=None, alibi_rows=_alibi_rows,
          lengths_in_block=_lengths_in_block, sink_in_split_decode=_sink_in_split_decode,
          interior_bias=_interior_keeps_mask):
    out_dtype = np.asarray(q).dtype
    wd = np.float64 if out_dtype == np.float64 else np.float32
    q, k, v = (np.asarray(a).astype(wd) for a in (q, k, v))
    b, hq, lq, dk = q.shape
    _, hkv, lk, dv = v.shape
    if k.shape[:3] != (b, hkv, lk) or k.shape[-1] != dk or hkv == 0 or hq % hkv:
        raise ValueError("incompatible q/k/v shapes")
    group = hq // hkv
    scale = wd(1.0 / math.sqrt(dk) if scale is None else scale)
    offset = int(query_offset)

    explicit = np.zeros((), wd)  # the explicit mask as an additive bias, (B, Hq, Lq, Lk) by broadcasting
    if mask is not None:
        m = np.asarray(mask)
        explicit = np.where(m, wd(0), wd(-np.inf)) if m.dtype == np.bool_ else m.astype(wd)
    explicit = np.broadcast_to(explicit, (b, hq, lq, lk))
    slopes = None if alibi_slopes is None else np.broadcast_to(
        np.asarray(alibi_slopes, np.float64).reshape(-1, hq), (b, hq)).astype(wd)
    lengths = None if key_lengths is None else np.asarray(key_lengths).astype(np.int64).reshape(b)
    sink = None if learnable_sink is None else np.asarray(learnable_sink, np.float64).reshape(hq).astype(wd)
    kx = np.repeat(k, group, axis=1)  # query head h reads kv head h // group
    vx = np.repeat(v, group, axis=1)

    def block_scores(first, last, start, stop):
        rows = np.arange(first, last + 1)[:, None] + offset
        keys = np.arange(start, stop)[None, :]
        s = (q[:, :, first:last + 1] @ np.swapaxes(kx[:, :, start:stop], -1, -2)) * scale
        if softcap is not None:
            s = wd(softcap) * np.tanh(s / wd(softcap))
        if slopes is not None:
            distance = np.abs(alibi_rows(first, last, offset)[:, None] - keys).astype(wd)
            s = s - slopes[:, :, None, None] * distance
        keep = np.ones((last + 1 - first, stop - start), bool)
        interior = is_causal and stop - 1 <= first + offset
        if is_causal and not interior:
            keep &= keys <= rows
        if window is not None:
            left, right = window
            if left is not None:
                keep &= keys >= rows - left
            if right is not None:
                keep &= keys <= rows + right
        keep = np.broadcast_to(keep, (b, hq) + keep.shape)
        if lengths is not None and lengths_in_block(start, stop, lk):
            keep = keep & (keys < lengths[:, None, None, None])
        bias = explicit[:, :, first:last + 1, start:stop]
        if interior:
            bias = interior_bias(bias)
        return np.where(keep, s + bias, -np.inf)

    def attend(first, last, key_ranges):
        """(max, sum, accumulator) of rows first..last over the key ranges, online."""
        n = last + 1 - first
        m_run = np.full((b, hq, n, 1), -np.inf, wd)
        l_run = np.zeros((b, hq, n, 1), wd)
        acc = np.zeros((b, hq, n, dv), wd)
        for start, stop in key_ranges:
            s = block_scores(first, last, start, stop)
            m_new = np.maximum(m_run, s.max(axis=-1, keepdims=True))
            m_safe = np.where(np.isneginf(m_new), wd(0), m_new)
            p = np.exp(s - m_safe)
            alpha = np.exp(m_run - m_safe)
            l_run = l_run * alpha + p.sum(axis=-1, keepdims=True)
            acc = acc * alpha + p @ vx[:, :, start:stop]
            m_run = m_new
        return m_run, l_run, acc

    def sink_term(m_run):
        """exp(sink - m) per row: the sink's share of the normaliser at the row's running maximum."""
        if sink is None:
            return np.zeros_like(m_run)
        return np.exp(sink[None, :, None, None] - np.where(np.isneginf(m_run), sink[None, :, None, None], m_run))

    def finish(m_run, l_run, acc, extra):
        total = l_run + extra
        return np.divide(acc, total, out=np.zeros_like(acc), where=(l_run > 0) & (total > 0))

    out = np.zeros((b, hq, lq, dv), wd)
    if lq == 1 and lk > SPLIT_KEYS:  # split-KV decode: partials per split, combined by their maxima
        parts = [attend(0, 0, [(s, min(s + KEY_BLOCK, lk)) for s in range(start, min(start + SPLIT_KEYS, lk),
                                                                                KEY_BLOCK)])
                 for start in range(0, lk, SPLIT_KEYS)]
        top = np.max(np.stack([m for m, _, _ in parts]), axis=0)
        top_safe = np.where(np.isneginf(top), wd(0), top)
        l_all = sum(l * np.exp(m - top_safe) for m, l, _ in parts)
        acc_all = sum(a * np.exp(m - top_safe) for m, _, a in parts)
        out[:] = finish(top, l_all, acc_all, sink_in_split_decode(sink_term(top)))
        return out.astype(out_dtype)
    for first in range(0, lq, QUERY_BLOCK):
        last = min(first + QUERY_BLOCK, lq) - 1
        key_stop = lk if not is_causal else max(0, min(lk, last + offset + 1))
        m_run, l_run, acc = attend(first, last, [(s, min(s + KEY_BLOCK, lk)) for s in range(0, key_stop, KEY_BLOCK)])
        out[:, :, first:last + 1] = finish(m_run, l_run, acc, sink_term(m_run))
    return out.astype(out_dtype)

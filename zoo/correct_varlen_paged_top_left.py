"""Correct: sdpa_varlen and sdpa_paged aligned top-left, as xformers' BlockDiagonalCausalMask does, by one dense mask.

Declares SEQUENCE_ALIGNMENT = "top-left": each sequence's query row i sits at position i (README "The contract",
spec/clauses.yaml varlen.alignment). Computed another way than correct_varlen_paged_reference: one attention over all
packed rows with a block-diagonal bias (a key counts for a query of its own sequence only; xformers' BlockDiagonalMask
idea), and the paged cache turned into a contiguous padded batch first (the unused slots masked). Float64, cast back.
"""
from __future__ import annotations

import math

import numpy as np

BUG = "none"
SOURCE = ("xformers bed3978b xformers/ops/fmha/attn_bias.py BlockDiagonalCausalMask (top-left in each block); "
          "README 'The contract' (SEQUENCE_ALIGNMENT)")
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32")
SEQUENCE_ALIGNMENT = "top-left"


def _dense(q, k, v, keep, bias, scale, softcap, sink):
    """q (Hq, R, Dk), k (Hkv, C, Dk), v (Hkv, C, Dv), keep (R, C) or (Hq, R, C), bias (Hq, R, C) -> (Hq, R, Dv)."""
    group = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    s = np.where(keep, s + bias, -np.inf)
    top = s.max(axis=-1, keepdims=True, initial=-np.inf)
    if sink is not None:
        top = np.maximum(top, sink[:, None, None])
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(s - top)
    total = e.sum(axis=-1, keepdims=True) + (0.0 if sink is None else np.exp(sink[:, None, None] - top))
    return (e / np.where(total > 0, total, 1.0)) @ v


def _keep_band(rows, cols, is_causal, window):
    keep = np.ones(np.broadcast_shapes(rows.shape, cols.shape), dtype=bool)
    if is_causal:
        keep &= cols <= rows
    if window is not None:
        if window[0] is not None:
            keep &= cols >= rows - window[0]
        if window[1] is not None:
            keep &= cols <= rows + window[1]
    return keep


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
    q64, k64, v64 = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    cq, ck = np.asarray(cu_seqlens_q, dtype=np.int64), np.asarray(cu_seqlens_k, dtype=np.int64)
    seq_q = np.searchsorted(cq, np.arange(q64.shape[0]), side="right") - 1  # each packed row's sequence
    seq_k = np.searchsorted(ck, np.arange(k64.shape[0]), side="right") - 1
    row = np.arange(q64.shape[0]) - cq[seq_q]  # top-left: a query's position is its row in the sequence
    col = np.arange(k64.shape[0]) - ck[seq_k]
    used = np.diff(ck) if seqused_k is None else np.asarray(seqused_k, dtype=np.int64)
    keep = (seq_q[:, None] == seq_k[None, :]) & (col < used[seq_k])[None, :] \
        & _keep_band(row[:, None], col[None, :], is_causal, window)
    hq = q64.shape[1]
    bias = np.zeros((hq, q64.shape[0], k64.shape[0]))
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)
        per_row = slopes[seq_q].T if slopes.ndim == 2 else slopes[:, None]  # (Hq, R)
        bias = -per_row[:, :, None] * np.abs(row[:, None] - col[None, :])[None]
    scale = 1 / math.sqrt(q64.shape[-1]) if scale is None else scale
    sink = None if learnable_sink is None else np.asarray(learnable_sink, dtype=np.float64)
    out = _dense(np.swapaxes(q64, 0, 1), np.swapaxes(k64, 0, 1), np.swapaxes(v64, 0, 1), keep, bias, scale,
                 softcap, sink)
    return np.swapaxes(out, 0, 1).astype(np.asarray(q).dtype)


def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
               softcap=None, alibi_slopes=None, learnable_sink=None):
    q64 = np.asarray(q, dtype=np.float64)
    kc, vc = np.asarray(k_cache, dtype=np.float64), np.asarray(v_cache, dtype=np.float64)
    table, used = np.asarray(block_table, dtype=np.int64), np.asarray(seqused_k, dtype=np.int64)
    scale = 1 / math.sqrt(q64.shape[-1]) if scale is None else scale
    sink = None if learnable_sink is None else np.asarray(learnable_sink, dtype=np.float64)
    out = np.zeros(q64.shape[:3] + (vc.shape[-1],))
    for b in range(q64.shape[0]):
        # The sequence's pages laid end to end (every entry of its table row: all name pages of the pool).
        keys = kc[table[b]].reshape(-1, *kc.shape[2:])
        values = vc[table[b]].reshape(-1, *vc.shape[2:])
        rows, cols = np.arange(q64.shape[2])[:, None], np.arange(keys.shape[0])[None, :]
        keep = (cols < used[b]) & _keep_band(rows, cols, is_causal, window)
        bias = np.zeros((q64.shape[1],) + keep.shape)
        if alibi_slopes is not None:
            slopes = np.asarray(alibi_slopes, dtype=np.float64)
            slopes = slopes[b] if slopes.ndim == 2 else slopes
            bias = -slopes[:, None, None] * np.abs(rows - cols)[None]
        out[b] = _dense(q64[b], np.swapaxes(keys, 0, 1), np.swapaxes(values, 0, 1), keep, bias, scale, softcap,
                        sink)
    return out.astype(np.asarray(q).dtype)

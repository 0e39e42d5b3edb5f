"""Correct: every sdpa variant keyword of the contract (window, softcap, ALiBi, query offset, lengths), in NumPy.

Written from the contract (README "The contract"), not from the oracle: the order of
sdpa.variant-order, step by step, in float64, cast back to q's dtype. The broken
variant members (zoo/broken_variant_*.py) call ``attend`` with one step replaced.
"""
from __future__ import annotations

import numpy as np

from zoo import _reference as ref

BUG = "none"
SOURCE = "README 'The contract' (variant keywords); spec/clauses.yaml sdpa.variant-order"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32", "float16", "bfloat16")


def query_positions(lq: int, query_offset: int) -> np.ndarray:
    """(lq, 1): query row i sits at position query_offset + i."""
    return (int(query_offset) + np.arange(lq))[:, None]


def causal_keep(lq: int, lk: int, query_offset: int) -> np.ndarray:
    return np.arange(lk)[None, :] <= query_positions(lq, query_offset)


def window_keep(lq: int, lk: int, window, query_offset: int) -> np.ndarray:
    """p - left <= j <= p + right, both edges inclusive; None is unbounded."""
    left, right = window
    p, j = query_positions(lq, query_offset), np.arange(lk)[None, :]
    keep = np.ones((lq, lk), dtype=bool)
    if left is not None:
        keep &= j >= p - left
    if right is not None:
        keep &= j <= p + right
    return keep


def length_keep(key_lengths, lk: int) -> np.ndarray:
    """(B, 1, 1, lk): example b keeps keys j < key_lengths[b]."""
    return np.arange(lk)[None, None, None, :] < np.asarray(key_lengths).astype(np.int64).reshape(-1, 1, 1, 1)


def capped(s: np.ndarray, softcap) -> np.ndarray:
    return softcap * np.tanh(s / softcap)


def alibi(slopes, hq: int, lq: int, lk: int, query_offset: int) -> np.ndarray:
    """(B or 1, Hq, lq, lk): -slope[b, h] * |p_i - j|."""
    slopes = ref.as64(slopes).reshape(-1, hq)
    distance = np.abs(query_positions(lq, query_offset) - np.arange(lk)[None, :])
    return -slopes[:, :, None, None] * distance


STEPS = {"causal_keep": causal_keep, "window_keep": window_keep, "length_keep": length_keep, "capped": capped,
         "alibi": alibi}


def attend(q, k, v, mask=None, is_causal=False, scale=None, window=None, softcap=None, alibi_slopes=None,
           query_offset=0, query_lengths=None, key_lengths=None, *, cap_after_mask=False, **steps):
    """The variant pipeline; ``steps`` replaces a step of STEPS by name (the broken members' one change)."""
    step = {**STEPS, **steps}
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    hq, lq, lk = q64.shape[1], q64.shape[2], k64.shape[2]
    k64, v64 = ref.expand_kv(k64, v64, hq)
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    s = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    if softcap is not None and not cap_after_mask:
        s = step["capped"](s, float(softcap))
    if alibi_slopes is not None:
        s = s + step["alibi"](alibi_slopes, hq, lq, lk, query_offset)
    keep = np.ones((1, 1, lq, lk), dtype=bool)
    if is_causal:
        keep = keep & step["causal_keep"](lq, lk, query_offset)
    if window is not None:
        keep = keep & step["window_keep"](lq, lk, window, query_offset)
    if key_lengths is not None:
        keep = keep & step["length_keep"](key_lengths, lk)
    s = s + ref.mask_bias(mask) + np.where(keep, 0.0, -np.inf)
    if softcap is not None and cap_after_mask:
        s = step["capped"](s, float(softcap))
    weights = ref.masked_softmax(s, axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    # query_lengths only marks padding rows, which the contract leaves unspecified: every row is computed.
    return attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                  key_lengths)

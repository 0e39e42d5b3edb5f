"""Broken: the window's right edge is exclusive (j < p + right), so window (l, 0) drops the diagonal."""
import numpy as np

from zoo import correct_variants_reference as base

BUG = "window=(left, right) keeps j < p_i + right instead of j <= p_i + right: the right edge is exclusive."
SOURCE = "known bug class (window edges off by one); FlashAttention's window is inclusive on both sides"
EXPECTED_CLAUSES = frozenset({"sdpa.window", "sdpa.variant-order"})
DTYPES = base.DTYPES


def window_keep(lq, lk, window, query_offset):
    left, right = window
    p, j = base.query_positions(lq, query_offset), np.arange(lk)[None, :]
    keep = np.ones((lq, lk), dtype=bool)
    if left is not None:
        keep &= j >= p - left
    if right is not None:
        keep &= j < p + right  # BUG: the contract keeps j <= p + right
    return keep


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, window_keep=window_keep)

"""Broken: the window is aligned at query row i, ignoring query_offset (a sliding window that forgets the cache)."""

from zoo import correct_variants_reference as base

BUG = "the window is centred on key i for query row i, not on its position query_offset + i (top-left aligned)."
SOURCE = "known bug class (the cache offset applied wrongly); FlashAttention aligns the window bottom-right"
EXPECTED_CLAUSES = frozenset({"sdpa.window", "sdpa.variant-order"})
DTYPES = base.DTYPES


def window_keep(lq, lk, window, query_offset):
    return base.window_keep(lq, lk, window, 0)  # BUG: the contract positions the window at query_offset + i


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, window_keep=window_keep)

"""Broken: ALiBi slopes applied to the heads in reversed order."""
from zoo import _reference as ref
from zoo import correct_variants_reference as base

BUG = "query head h gets slope[Hq - 1 - h]: the slopes are applied in reversed head order."
SOURCE = "known bug class (slopes per head in the wrong order); ALiBi's geometric slopes are ordered by head"
EXPECTED_CLAUSES = frozenset({"sdpa.alibi", "sdpa.variant-order"})
DTYPES = base.DTYPES


def alibi(slopes, hq, lq, lk, query_offset):
    reversed_slopes = ref.as64(slopes).reshape(-1, hq)[:, ::-1]  # BUG: head h must use slope h
    return base.alibi(reversed_slopes, hq, lq, lk, query_offset)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, alibi=alibi)

"""Broken: is_causal stays top-left with a KV cache: query_offset is ignored by the causal band."""
from zoo import correct_variants_reference as base

BUG = "the causal band keeps j <= i, not j <= query_offset + i: decode against a cache sees only its first keys."
SOURCE = "known bug class (the cache offset applied to the causal band wrongly); FlashAttention's kvcache aligns bottom-right"
EXPECTED_CLAUSES = frozenset({"sdpa.query-offset", "sdpa.variant-order"})
DTYPES = base.DTYPES


def causal_keep(lq, lk, query_offset):
    return base.causal_keep(lq, lk, 0)  # BUG: the contract's band is j <= query_offset + i


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, causal_keep=causal_keep)

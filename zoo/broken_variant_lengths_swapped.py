"""Broken: the keys are cut at query_lengths (the two length arrays swapped), not at key_lengths."""
from zoo import correct_variants_reference as base

BUG = "keys j >= query_lengths[b] are masked instead of j >= key_lengths[b]: the length arrays are swapped."
SOURCE = "known bug class (lengths applied to the wrong side); JAX names them query_seq_lengths / key_value_seq_lengths"
EXPECTED_CLAUSES = frozenset({"sdpa.varlen", "sdpa.variant-order", "mask.fully-masked-row"})
DTYPES = base.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    # BUG: the contract masks keys with key_lengths; query_lengths only marks padding query rows
    keys = query_lengths if query_lengths is not None else key_lengths
    if keys is not None:
        keys = [min(int(n), k.shape[2]) for n in keys]
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       keys)

"""Broken: the block table read at the sequence's first entry only, pages assumed contiguous from there."""
from zoo import correct_varlen_paged_reference as base

BUG = ("key j of sequence b is read from page block_table[b, 0] + j // block_size (the table's first entry, pages "
       "assumed contiguous) instead of block_table[b, j // block_size]: wrong once a sequence spans two pages of a "
       "shuffled pool.")
SOURCE = "known bug class (a block table indexed by the sequence's first block; FlashAttention's tests shuffle pages)"
EXPECTED_CLAUSES = frozenset({"paged.block-table", "paged.definition", "paged.alignment", "paged.variants"})
DTYPES = base.DTYPES


def page_slots(block_table_row, used, block_size):
    return [(int(block_table_row[0]) + j // block_size, j % block_size) for j in range(used)]  # BUG


def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
               softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.paged(q, k_cache, v_cache, block_table, seqused_k, is_causal, scale, window, softcap, alibi_slopes,
                      learnable_sink, page_slots=page_slots)

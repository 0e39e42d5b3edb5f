"""Broken: the block table staged in a buffer of 16 entries, read modulo 16."""
from zoo import correct_varlen_paged_reference as base

BUG = ("key j of sequence b is read from page block_table[b, (j // block_size) % 16], as a kernel that staged 16 "
       "block-table entries at a time and never reloaded them: wrong once a sequence spans more than 16 pages.")
SOURCE = ("zoo extra: an independently written paged kernel (2026-11-28); default runs whose block tables held at "
          "most 10 pages passed it")
EXPECTED_CLAUSES = frozenset({"paged.definition", "paged.variants", "paged.block-table", "paged.seqused-k",
                              "paged.alignment"})
DTYPES = base.DTYPES


def page_slots(block_table_row, used, block_size):
    return [(int(block_table_row[(j // block_size) % 16]), j % block_size) for j in range(used)]  # BUG


def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
               softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.paged(q, k_cache, v_cache, block_table, seqused_k, is_causal, scale, window, softcap, alibi_slopes,
                      learnable_sink, page_slots=page_slots)

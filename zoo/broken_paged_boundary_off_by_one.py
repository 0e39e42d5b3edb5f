"""Broken: the page pointer advances one key late, so the first key of every page after the first is read from the
page before."""
from zoo import correct_varlen_paged_reference as base

BUG = ("key j is read from page block_table[b, (j - 1) // block_size] at slot j % block_size: at each page boundary "
       "(j a multiple of the block size) the previous page's slot 0 is read instead of the new page's.")
SOURCE = "known bug class (off by one page at a page boundary: the page index advanced after the slot instead of with it)"
EXPECTED_CLAUSES = frozenset({"paged.block-table", "paged.definition", "paged.alignment", "paged.variants"})
DTYPES = base.DTYPES


def page_slots(block_table_row, used, block_size):
    return [(int(block_table_row[max(j - 1, 0) // block_size]), j % block_size) for j in range(used)]  # BUG


def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
               softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.paged(q, k_cache, v_cache, block_table, seqused_k, is_causal, scale, window, softcap, alibi_slopes,
                      learnable_sink, page_slots=page_slots)

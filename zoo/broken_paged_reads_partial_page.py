"""Broken: the last page is read to its end, past seqused_k."""
from zoo import correct_varlen_paged_reference as base

BUG = ("every slot of a sequence's last used page is attended (ceil(seqused_k / block_size) * block_size keys): the "
       "slots past seqused_k[b] - 1 of a partly filled last page are read.")
SOURCE = "known bug class (reading the last partial page past seqused_k; FlashInfer's kv_last_page_len exists for it)"
EXPECTED_CLAUSES = frozenset({"paged.seqused-k", "paged.definition", "paged.block-table", "paged.alignment",
                              "paged.variants"})
DTYPES = base.DTYPES


def page_slots(block_table_row, used, block_size):
    whole = -(-used // block_size) * block_size  # BUG: the whole last page
    return [(int(block_table_row[j // block_size]), j % block_size) for j in range(whole)]


def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
               softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.paged(q, k_cache, v_cache, block_table, seqused_k, is_causal, scale, window, softcap, alibi_slopes,
                      learnable_sink, page_slots=page_slots)

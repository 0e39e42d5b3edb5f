"""Broken: a bounded left window side with an unbounded right gets the right side seqlen_k (FlashAttention 2).

flash_api.cpp: ``if (window_size_right >= max_seqlen_k) window_size_right = -1;`` then ``if (window_size_left >= 0 &&
window_size_right < 0) window_size_right = seqlen_k;``, seqlen_k the batch's longest key run (varlen) or the block
table's pages times their size (kvcache). With bottom-right positions p_i = i + Lk_b - Lq_b, the first rows of a
sequence with two more queries than that sit before its keys, and j <= p_i + seqlen_k removes keys they attend.
"""
from zoo import correct_varlen_paged_reference as base

BUG = ("without is_causal, window (left, None) or (left, right >= seqlen_k) keeps j <= p_i + seqlen_k on the right "
       "(seqlen_k: max_seqlen_k, or the table's pages x page size): rows before a short sequence's keys lose keys.")
SOURCE = "flash-attention issue #895 (window_size_right replaced by seqlen_k; bottom-right sequences with Lq > Lk)"
EXPECTED_CLAUSES = frozenset({"varlen.variants", "paged.variants", "varlen.alignment", "paged.alignment"})
DTYPES = base.DTYPES


def clamped_keep(seqlen_k: int):
    def keep_keys(positions, lk, is_causal, window):
        if window is not None and not is_causal:
            left, right = window
            left = None if left is not None and left >= seqlen_k else left
            right = None if right is not None and right >= seqlen_k else right
            if left is not None and right is None:
                right = seqlen_k  # BUG: the contract leaves the right side unbounded
            window = (left, right)
        return base.keep_keys(positions, lk, is_causal, window)
    return keep_keys


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, seqused_k, window, softcap,
                       alibi_slopes, learnable_sink, keep_keys=clamped_keep(int(max_seqlen_k)))


def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
               softcap=None, alibi_slopes=None, learnable_sink=None):
    seqlen_k = block_table.shape[1] * k_cache.shape[1]
    return base.paged(q, k_cache, v_cache, block_table, seqused_k, is_causal, scale, window, softcap, alibi_slopes,
                      learnable_sink, keep_keys=clamped_keep(int(seqlen_k)))

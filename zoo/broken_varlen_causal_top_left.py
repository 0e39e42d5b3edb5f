"""Broken: each sequence's causal band aligned top-left while the member declares bottom-right (the default)."""
import numpy as np

from zoo import correct_varlen_paged_reference as base

BUG = ("each sequence's queries are placed top-left (query row i at position i) although SEQUENCE_ALIGNMENT is the "
       "default bottom-right (i + Lk_b - Lq_b): wrong wherever a sequence has Lq_b != Lk_b under is_causal, a window "
       "or ALiBi.")
SOURCE = "known bug class (per-sequence causal alignment; flash-attention < 2.1 was top-left, >= 2.1 bottom-right)"
EXPECTED_CLAUSES = frozenset({"varlen.alignment", "paged.alignment"})
DTYPES = base.DTYPES


def query_positions(lq, lk, alignment):
    return np.arange(lq)  # BUG: top-left whatever the declared alignment


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, seqused_k, window, softcap,
                       alibi_slopes, learnable_sink, query_positions=query_positions)


def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
               softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.paged(q, k_cache, v_cache, block_table, seqused_k, is_causal, scale, window, softcap, alibi_slopes,
                      learnable_sink, query_positions=query_positions)

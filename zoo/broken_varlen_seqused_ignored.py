"""Broken: seqused_k ignored, so each sequence attends all its packed key rows, the unused ones too."""
from zoo import correct_varlen_paged_reference as base

BUG = "seqused_k is ignored: every packed key row of a sequence is attended, the garbage past seqused_k[b] too."
SOURCE = "known bug class (reading past seqused_k; FlashAttention 3's seqused_k keeps the first keys of each sequence)"
EXPECTED_CLAUSES = frozenset({"varlen.seqused-k", "varlen.definition", "varlen.variants", "varlen.alignment",
                              "mask.fully-masked-row"})
DTYPES = base.DTYPES


def spans(cu_seqlens_q, cu_seqlens_k, seqused_k):
    return base.spans(cu_seqlens_q, cu_seqlens_k, None)  # BUG: seqused_k dropped


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, seqused_k, window, softcap,
                       alibi_slopes, learnable_sink, spans=spans)

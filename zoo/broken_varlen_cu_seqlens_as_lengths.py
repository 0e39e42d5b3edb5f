"""Broken: cu_seqlens_k read as lengths, so every sequence after the first reads keys past its own end."""
from zoo import correct_varlen_paged_reference as base

BUG = ("sequence b's keys are taken as cu_seqlens_k[b + 1] keys from cu_seqlens_k[b] (the offset read as a length): "
       "every sequence after the first also attends the keys of the sequences after it.")
SOURCE = "known bug class (cu_seqlens read as lengths; FlashAttention takes offsets, FlashInfer indptr arrays)"
EXPECTED_CLAUSES = frozenset({"varlen.cu-seqlens", "varlen.definition", "varlen.alignment", "varlen.variants",
                              "mask.fully-masked-row"})
DTYPES = base.DTYPES


def spans(cu_seqlens_q, cu_seqlens_k, seqused_k):
    found = base.spans(cu_seqlens_q, cu_seqlens_k, seqused_k)
    if seqused_k is not None:
        return found
    return [(qs, qe, ks, ks + int(cu_seqlens_k[b + 1])) for b, (qs, qe, ks, _) in enumerate(found)]  # BUG


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, seqused_k, window, softcap,
                       alibi_slopes, learnable_sink, spans=spans)

"""Broken: a packed sequence longer than one key block of 64 loses the keys past its last whole block."""
from zoo import correct_varlen_paged_reference as base

BUG = ("a sequence with more than 64 used keys attends only its first 64 * (Lk_b // 64): the partial last key block "
       "(Lk_b % 64 keys) is dropped, as a varlen kernel whose tail path covered only the first block does.")
SOURCE = ("zoo extra: an independently written varlen kernel (2026-11-28); default runs whose packed sequences stayed "
          "within 17 keys passed it")
EXPECTED_CLAUSES = frozenset({"varlen.definition", "varlen.variants", "varlen.seqused-k", "varlen.alignment",
                              "varlen.padded-agreement", "mask.fully-masked-row"})
DTYPES = base.DTYPES


def spans(cu_seqlens_q, cu_seqlens_k, seqused_k):
    out = []
    for q0, q1, k0, k1 in base.spans(cu_seqlens_q, cu_seqlens_k, seqused_k):
        used = k1 - k0
        out.append((q0, q1, k0, k0 + (used if used <= 64 else 64 * (used // 64))))  # BUG: the partial block dropped
    return out


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, seqused_k, window, softcap,
                       alibi_slopes, learnable_sink, spans=spans)

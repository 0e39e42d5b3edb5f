"""Broken: a sequence's seqused_k of 0 read as "not given", so that sequence attends all its packed key rows."""
import numpy as np

from zoo import correct_varlen_paged_reference as base

BUG = ("seqused_k[b] = 0 is taken for 'no limit' (a falsy test, `seqused_k[b] or packed_length`): an empty sequence's "
       "queries attend the garbage in its unused key rows.")
SOURCE = ("written blind against varlen.seqused-k (`used = seqused_k[b] or ke - ks`); FlashAttention 3's seqused_k "
          "may be 0 for a sequence with no keys yet")
EXPECTED_CLAUSES = frozenset({"varlen.seqused-k"})
DTYPES = base.DTYPES


def spans(cu_seqlens_q, cu_seqlens_k, seqused_k):
    if seqused_k is not None:
        seqused_k = np.where(np.asarray(seqused_k) == 0, np.diff(np.asarray(cu_seqlens_k)), seqused_k)  # BUG
    return base.spans(cu_seqlens_q, cu_seqlens_k, seqused_k)


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
    return base.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, seqused_k, window, softcap,
                       alibi_slopes, learnable_sink, spans=spans)

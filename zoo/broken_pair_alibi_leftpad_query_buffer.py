"""Broken twin: ALiBi's distance with the query at its buffer position but the key at its real one (j - P)."""
import numpy as np

from zoo import _reference as ref
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "with key_leftpad P the ALiBi bias is -slope |p_i - (j - P)|: the key counted from the first real key, the query not, so distances grow by P."
SOURCE = "independently written kernel (ALiBi under left padding); wrong only where both are given"
EXPECTED_CLAUSES = frozenset({"sdpa.alibi", "sdpa.key-leftpad", "sdpa.feature-pairs"})
DTYPES = base.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    if alibi_slopes is not None and key_leftpad is not None:
        b, hq, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        pad = np.asarray(key_leftpad).astype(np.int64).reshape(-1, 1, 1, 1)
        query = (int(query_offset) + np.arange(lq)).reshape(1, 1, lq, 1)
        key = np.arange(lk).reshape(1, 1, 1, lk) - pad  # BUG: the key's real position, the query's buffer one
        slopes = ref.as64(alibi_slopes).reshape(-1, hq)[:, :, None, None]
        bias = -slopes * np.abs(query - key) + ref.mask_bias(mask)
        mask, alibi_slopes = np.broadcast_to(bias, (b, hq, lq, lk)), None
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad)

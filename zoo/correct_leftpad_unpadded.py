"""Correct: left padding by unpadding, one example at a time: drop its first P keys, then attend with positions
counted from the first real key.

What "positions count from the first real key" means operationally (spec/clauses.yaml sdpa.key-leftpad): example b's
keys become k[b, :, P:], the queries sit at query_offset - P + i, key_lengths[b] becomes key_lengths[b] - P; the
window, its sink tokens and the chunk are then those of an unpadded case (zoo/correct_sink_chunk_leftpad_reference's
pipeline with no left padding), in float64.
"""
from __future__ import annotations

import numpy as np

from zoo import _reference as ref
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "none"
SOURCE = "spec/clauses.yaml sdpa.key-leftpad; FlashAttention's kvcache API (cache_leftpad: the index the KV cache starts)"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32")


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, query_offset=0, query_lengths=None,
         key_lengths=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    b, hq, lq, _ = q64.shape
    lk = k64.shape[2]
    bias = np.broadcast_to(ref.mask_bias(mask), (b, hq, lq, lk))
    pads = np.zeros(b, dtype=np.int64) if key_leftpad is None else np.asarray(key_leftpad).astype(np.int64)
    out = np.zeros((b, hq, lq, v64.shape[-1]))
    for example, pad in enumerate(pads):
        if pad >= lk:
            continue  # every key is padding: the rows have no key (zeros)
        ends = None
        if key_lengths is not None:
            ends = np.array([max(int(key_lengths[example]) - pad, 0)])
        out[example:example + 1] = base.attend(
            q64[example:example + 1], k64[example:example + 1, :, pad:], v64[example:example + 1, :, pad:],
            bias[example:example + 1, :, :, pad:], is_causal, scale, window, None, None,
            int(query_offset) - int(pad), None, ends, None, sink_token_length, attention_chunk, None)
    return out.astype(ref.out_dtype(q))

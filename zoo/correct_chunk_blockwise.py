"""Correct: chunked local attention computed chunk by chunk, each chunk's queries against that chunk's keys alone.

Llama 4's chunked layers as a loop: positions [cC, (c + 1)C) form chunk c; the queries of chunk c attend the keys
of chunk c (causal within it where is_causal), nothing else. Queries outside every key chunk get zeros. Written
from spec/clauses.yaml sdpa.attention-chunk as a block-diagonal loop, not as a mask over all keys.
"""
from __future__ import annotations

import numpy as np

from zoo import _reference as ref

BUG = "none"
SOURCE = "spec/clauses.yaml sdpa.attention-chunk; transformers masking_utils create_chunked_causal_mask (block-diagonal)"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32")


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, query_offset=0, attention_chunk=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    b, hq, lq, _ = q64.shape
    lk = k64.shape[2]
    k64, v64 = ref.expand_kv(k64, v64, hq)
    scale = ref.default_scale(q64.shape[-1]) if scale is None else float(scale)
    bias = np.broadcast_to(ref.mask_bias(mask), (b, hq, lq, lk))
    query_position = int(query_offset) + np.arange(lq)
    chunk = int(attention_chunk) if attention_chunk is not None else lk + query_position[-1] + 1  # one chunk: all
    out = np.zeros((b, hq, lq, v64.shape[-1]))
    for c in sorted(set(query_position // chunk)):
        rows = np.flatnonzero(query_position // chunk == c)
        start, stop = c * chunk, min((c + 1) * chunk, lk)
        if stop <= start:
            continue  # no key in this chunk: the rows stay zeros (fully masked)
        s = (q64[:, :, rows] @ np.swapaxes(k64[:, :, start:stop], -1, -2)) * scale + bias[:, :, rows, start:stop]
        if is_causal:
            s = np.where(np.arange(start, stop)[None, :] <= query_position[rows][:, None], s, -np.inf)
        out[:, :, rows] = ref.masked_softmax(s, axis=-1) @ v64[:, :, start:stop]
    return out.astype(ref.out_dtype(q))

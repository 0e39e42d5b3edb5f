"""Broken twin: the chunk index by truncating division, wrong for a query inside the left padding."""
import numpy as np

from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "chunk index int(position / C) (towards zero): a query at a negative position (inside the left padding) lands in chunk 0 with the first real keys instead of chunk -1, which holds none."
SOURCE = "independently written kernel (C-style integer division of positions); wrong only with a chunk and a left padding past a query"
EXPECTED_CLAUSES = frozenset({"sdpa.attention-chunk", "sdpa.key-leftpad", "sdpa.feature-pairs", "mask.fully-masked-row"})
DTYPES = base.DTYPES


def _chunk_keep(query, key, chunk):
    return np.fix(key / int(chunk)) == np.fix(query / int(chunk))  # BUG: truncation, not floor


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad,
                       chunk_keep=_chunk_keep)

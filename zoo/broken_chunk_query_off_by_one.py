"""Broken: the query's chunk is found from its 1-based position, so the last query of a chunk lands in the next."""
import numpy as np

from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "the query's chunk is floor((p + 1) / C) while the keys' is floor(j / C): an off-by-one chunk boundary."
SOURCE = "known bug class (an off-by-one chunk boundary; FlashAttention's construct_chunk_mask uses p - p % C)"
EXPECTED_CLAUSES = frozenset({"sdpa.attention-chunk", "sdpa.key-leftpad", "mask.fully-masked-row"})
DTYPES = base.DTYPES


def chunk_keep(query, key, chunk):
    return np.floor_divide(key, int(chunk)) == np.floor_divide(query + 1, int(chunk))  # BUG: p + 1


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad,
                       chunk_keep=chunk_keep)

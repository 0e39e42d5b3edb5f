"""Broken: a tiled kernel skips the key blocks left of a query block's windows, the sink tokens' block with them."""
import numpy as np

from zoo import correct_sink_chunk_leftpad_reference as base

BUG = ("each block of 64 query rows visits only the key blocks of 64 that reach its first row's window, p - left: a "
       "block wholly left of it is skipped, though the sink tokens in it pass the left edge.")
SOURCE = ("zoo extra: an independently written tiled kernel (2026-11-28) whose window skipping did not exempt the "
          "sink tokens' block; only a window starting past a key block with sink tokens reaches it")
EXPECTED_CLAUSES = frozenset({"sdpa.sink-tokens", "sdpa.window"})
DTYPES = base.DTYPES
BLOCK = 64


def window_keep(query, key, window, sink_token_length):
    keep = base.window_keep(query, key, window, sink_token_length)
    if window[0] is None:
        return keep
    rows = query - query.min(axis=-2, keepdims=True)  # each query's row within the call
    first = query - rows % BLOCK  # the first row of its block of 64 rows
    visited = (np.floor_divide(key, BLOCK) + 1) * BLOCK > first - int(window[0])
    return keep & visited  # BUG: a skipped block's sink tokens are skipped with it


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad,
                       window_keep=window_keep)

"""Broken: sink tokens escape the whole window, its right edge included (only its left edge should let them by)."""

from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "a sink token is kept whatever the window: (p - left <= j <= p + right) or j is a sink token."
SOURCE = ("known bug class (StreamingLLM sink tokens kept unconditionally); FlashAttention's construct_local_mask "
          "exempts them from the left edge only (col < row + sk - sq - window_size[0] and col >= sink_token_length)")
EXPECTED_CLAUSES = frozenset({"sdpa.sink-tokens", "sdpa.key-leftpad", "mask.fully-masked-row"})
DTYPES = base.DTYPES


def window_keep(query, key, window, sink_token_length):
    inside = base.window_keep(query, key, window, 0)
    return inside | ((key >= 0) & (key < int(sink_token_length)))  # BUG: past the right edge too


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad,
                       window_keep=window_keep)

"""What the log-sum-exp members of the zoo share: sdpa (every variant of the sink, chunk and left-padding reference)
returning (out, lse) with its lse step replaced. Not a member itself (the leading underscore)."""
from __future__ import annotations

from zoo import correct_sink_chunk_leftpad_reference as base

DTYPES = ("float64", "float32", "float16", "bfloat16")


def sdpa_with_lse(lse_step):
    """An sdpa whose lse is ``lse_step(s, sink)`` (s the scores the softmax sees, sink (1, Hq, 1, 1) or None)."""

    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None, return_lse=False):
        return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset,
                           query_lengths, key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad,
                           return_lse, lse=lse_step)

    return sdpa

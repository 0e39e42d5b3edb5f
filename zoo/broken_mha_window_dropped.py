"""Broken: multi_head_attention takes the window but never hands it to the heads' attention."""
from zoo import correct_mha_variants_loop as base

BUG = ("multi_head_attention accepts window= but the per-head attention runs without it: every key the window "
       "should remove is attended (the wrapper forwards mask and is_causal only).")
SOURCE = ("known bug class (MHA drops the window after the projections): a wrapper whose signature grew a keyword "
          "that its call of the inner attention does not pass on")
EXPECTED_CLAUSES = frozenset({"sdpa.window", "mha.variants"})
DTYPES = base.DTYPES


def without_window(h, window=None, **variants):
    return base.head_options(h, **variants)  # BUG: the window is dropped here


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                         softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                         learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
    out = base.heads_loop(query, key, value, params, num_heads, mask, is_causal, without_window, window=window,
                          softcap=softcap, alibi_slopes=alibi_slopes, query_offset=query_offset,
                          key_lengths=key_lengths, learnable_sink=learnable_sink,
                          sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                          key_leftpad=key_leftpad)
    return out.astype(base.ref.out_dtype(query))

"""Broken: the learnable sink's weight multiplies a value row (key 0's), as if the sink slot were a key."""
import numpy as np

from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "the sink's weight p_sink is given key 0's value: o_i = sum_j p_ij v_j + p_sink v_0 (the sink takes no value)."
SOURCE = ("known bug class (a kernel that stores the sink in the first key slot of its tile and reads that slot's v); "
          "gpt-oss drops the sink column (W[..., :-1]) before @ V")
EXPECTED_CLAUSES = frozenset({"sdpa.learnable-sink"})
DTYPES = base.DTYPES


def sink_weights(s, sink):
    weights = base.sink_weights(s, sink)
    m = np.maximum(np.max(s, axis=-1, keepdims=True), sink)
    p_sink = np.exp(sink - m) / (np.sum(np.exp(s - m), axis=-1, keepdims=True) + np.exp(sink - m))
    weights = np.array(weights)
    weights[..., :1] += p_sink  # BUG: the sink's weight lands on v_0
    return weights


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad,
                       sink_weights=sink_weights)

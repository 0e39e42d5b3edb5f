"""Broken: correct forward with every variant, the learnable sink's gradient of the wrong sign (ARRAY = "torch")."""
from zoo import correct_torch_variant_backward as base

BUG = ("the learnable sink's gradient is +sum_b sum_i P_sink (dO . O) instead of minus it: the sink moves the wrong "
       "way in training (raising sigma lowers every key's weight).")
SOURCE = ("issue 25 list (the sink's gradient of the wrong sign): d P_sink / d sigma = P_sink (1 - P_sink) > 0 is "
          "taken for the loss's derivative, whose chain through the keys' weights (each falls as sigma rises) carries "
          "the minus sign (FlashAttention 4: sink_sum += -sink_prob * dpsum)")
EXPECTED_CLAUSES = frozenset({"grad.learnable-sink"})
ARRAY = "torch"
DTYPES = base.DTYPES


class SDPA(base.VariantSDPA):
    SINK_SIGN = 1.0  # BUG: dsink = +sum P_sink r


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.call(SDPA, q, k, v, mask, is_causal, scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                     query_offset=query_offset, key_lengths=key_lengths, learnable_sink=learnable_sink,
                     sink_token_length=sink_token_length, attention_chunk=attention_chunk, key_leftpad=key_leftpad)

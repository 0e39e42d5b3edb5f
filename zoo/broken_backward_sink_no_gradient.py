"""Broken: correct forward with every variant, no gradient for the learnable sink (ARRAY = "torch")."""
from zoo import correct_torch_variant_backward as base

BUG = ("the backward returns no gradient for the learnable sink (None, as if it were a constant like the ALiBi "
       "slopes): a trained sink never moves.")
SOURCE = ("issue 25 list (the sink's gradient not flowing): a custom backward written for q, k, v whose return tuple "
          "leaves the new input's slot None")
EXPECTED_CLAUSES = frozenset({"grad.learnable-sink"})
ARRAY = "torch"
DTYPES = base.DTYPES


class SDPA(base.VariantSDPA):
    SINK_GRADIENT = False  # BUG: dsink never returned


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.call(SDPA, q, k, v, mask, is_causal, scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                     query_offset=query_offset, key_lengths=key_lengths, learnable_sink=learnable_sink,
                     sink_token_length=sink_token_length, attention_chunk=attention_chunk, key_leftpad=key_leftpad)

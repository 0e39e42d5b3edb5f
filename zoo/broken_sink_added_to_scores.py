"""Broken: the learnable sink added to every score instead of joining the normaliser (a no-op under softmax)."""
from zoo import _reference as ref
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "the sink logit is added to every key's score (s_ij + sigma_h) instead of entering the normaliser as its own term."
SOURCE = ("known bug class (a sink folded into the scores as a bias); softmax is shift-invariant, so the sink has no "
          "effect at all: FlashAttention 3/4 and gpt-oss add exp(sigma - m) to the normaliser")
EXPECTED_CLAUSES = frozenset({"sdpa.learnable-sink"})
DTYPES = base.DTYPES


def sink_weights(s, sink):
    return ref.masked_softmax(s + sink, axis=-1)  # BUG: the contract's sink is a term of the normaliser, not a bias


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad,
                       sink_weights=sink_weights)

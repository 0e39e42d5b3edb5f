"""Broken twin: key_lengths read as a count after the left padding (keys P <= j < P + L kept, not j < L)."""
import numpy as np

from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "with key_leftpad P and key_lengths L an example keeps keys j < P + L: the lengths counted from the first real key, though they end the buffer's keys."
SOURCE = "independently written kernel (left padding read against key lengths); wrong only where both are given and the band does not hide key L"
EXPECTED_CLAUSES = frozenset({"sdpa.key-leftpad", "sdpa.varlen", "sdpa.feature-pairs", "mask.fully-masked-row"})
DTYPES = base.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    if key_lengths is not None and key_leftpad is not None:  # BUG: the lengths counted after the padding
        key_lengths = np.minimum(np.asarray(key_lengths) + np.asarray(key_leftpad), k.shape[2]).astype(np.int32)
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad)

"""Broken: left padding shifts the keys' positions but not the queries', moving the causal band P keys right."""
import numpy as np

from zoo import correct_sink_chunk_leftpad_reference as base

BUG = ("key j sits at j - P but query row i stays at query_offset + i: the causal band (and the window and chunk) "
       "moves key_leftpad keys into the future.")
SOURCE = ("known bug class (a left-pad shifting the causal band wrongly); FlashAttention counts both from the first "
          "real key (construct_local_mask: col - key_leftpad against row + sk - sq, sk the real keys)")
EXPECTED_CLAUSES = frozenset({"sdpa.key-leftpad", "mask.fully-masked-row"})
DTYPES = base.DTYPES


def positions(lq, lk, query_offset, key_leftpad):
    query, key = base.positions(lq, lk, query_offset, key_leftpad)
    pad = 0 if key_leftpad is None else np.asarray(key_leftpad).astype(np.int64).reshape(-1, 1, 1, 1)
    return query + pad, key  # BUG: the query's position is counted from the buffer's start, the key's from P


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad,
                       positions=positions)

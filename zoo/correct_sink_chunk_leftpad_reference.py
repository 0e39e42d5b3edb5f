"""Correct: learnable sinks, sink tokens, chunked attention and left padding, with every older variant.

Written from the contract (README "The contract"; spec/clauses.yaml sdpa.learnable-sink, sdpa.sink-tokens,
sdpa.attention-chunk, sdpa.key-leftpad), not from the oracle: positions per example, counted from the first real
key; the key set as the intersection of one step per feature; the sink as one more term of the normaliser. Float64
throughout, cast back to q's dtype. The broken sink, chunk and left-padding members (zoo/broken_sink_*.py,
broken_chunk_*.py, broken_leftpad_*.py) call ``attend`` with one step replaced.
"""
from __future__ import annotations

import numpy as np

from zoo import _reference as ref
from zoo import correct_variants_reference as variants

BUG = "none"
SOURCE = "README 'The contract' (variant keywords); spec/clauses.yaml sdpa.learnable-sink ... sdpa.key-leftpad"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32", "float16", "bfloat16")


def positions(lq: int, lk: int, query_offset: int, key_leftpad):
    """(query positions (B|1, 1, lq, 1), key positions (B|1, 1, 1, lk)): query row i at query_offset + i - P_b,
    key j at j - P_b, P_b the example's left padding (0 without one)."""
    pad = 0 if key_leftpad is None else np.asarray(key_leftpad).astype(np.int64).reshape(-1, 1, 1, 1)
    query = (int(query_offset) + np.arange(lq)).reshape(1, 1, lq, 1) - pad
    key = np.arange(lk).reshape(1, 1, 1, lk) - pad
    return query, key


def causal_keep(query, key):
    return key <= query


def window_keep(query, key, window, sink_token_length):
    """p - left <= j <= p + right (None unbounded); the first sink_token_length real keys pass the left edge."""
    left, right = window
    keep = np.ones(np.broadcast_shapes(query.shape, key.shape), dtype=bool)
    if left is not None:
        keep &= (key >= query - int(left)) | ((key >= 0) & (key < int(sink_token_length)))
    if right is not None:
        keep &= key <= query + int(right)
    return keep


def chunk_keep(query, key, chunk):
    """Same chunk: floor(key / C) == floor(query / C)."""
    return np.floor_divide(key, int(chunk)) == np.floor_divide(query, int(chunk))


def leftpad_keep(key):
    return key >= 0


def sink_weights(s, sink):
    """The softmax of the scores with the sink logit (1, Hq, 1, 1) in the normaliser and no value."""
    m = np.maximum(np.max(s, axis=-1, keepdims=True), sink)
    e = np.exp(s - m)
    return e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sink - m))


def lse(s, sink):
    """Each row's log-sum-exp (B, Hq, Lq): the log of the softmax's normaliser, the sink's term counted once (sink
    None: none); -inf for a row without keys."""
    logits = s if sink is None else np.concatenate([s, np.broadcast_to(sink, s.shape[:-1] + (1,))], axis=-1)
    m = np.max(logits, axis=-1, keepdims=True)
    shift = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return (shift + np.log(np.sum(np.exp(logits - shift), axis=-1, keepdims=True)))[..., 0]


STEPS = {"positions": positions, "causal_keep": causal_keep, "window_keep": window_keep, "chunk_keep": chunk_keep,
         "leftpad_keep": leftpad_keep, "sink_weights": sink_weights, "lse": lse}


def attend(q, k, v, mask=None, is_causal=False, scale=None, window=None, softcap=None, alibi_slopes=None,
           query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
           attention_chunk=None, key_leftpad=None, return_lse=False, **steps):
    """The pipeline in the order of sdpa.variant-order; ``steps`` replaces a step of STEPS by name (a broken
    member's one change). ``return_lse``: (out, lse), lse float32 (B, Hq, Lq)."""
    step = {**STEPS, **steps}
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    hq, lq, lk = q64.shape[1], q64.shape[2], k64.shape[2]
    k64, v64 = ref.expand_kv(k64, v64, hq)
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    s = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    if softcap is not None:
        s = variants.capped(s, float(softcap))
    if alibi_slopes is not None:  # distances do not move with the left padding
        s = s + variants.alibi(alibi_slopes, hq, lq, lk, query_offset)
    query, key = step["positions"](lq, lk, query_offset, key_leftpad)
    keep = np.ones(np.broadcast_shapes(query.shape, key.shape), dtype=bool)
    if is_causal:
        keep = keep & step["causal_keep"](query, key)
    if window is not None:
        keep = keep & step["window_keep"](query, key, window, sink_token_length)
    if attention_chunk is not None:
        keep = keep & step["chunk_keep"](query, key, attention_chunk)
    if key_leftpad is not None:
        keep = keep & step["leftpad_keep"](key)
    if key_lengths is not None:
        keep = keep & variants.length_keep(key_lengths, lk)
    s = s + ref.mask_bias(mask) + np.where(keep, 0.0, -np.inf)
    sink = None if learnable_sink is None else ref.as64(learnable_sink).reshape(1, hq, 1, 1)
    weights = ref.masked_softmax(s, axis=-1) if sink is None else step["sink_weights"](s, sink)
    out = (weights @ v64).astype(ref.out_dtype(q))
    if not return_lse:
        return out
    return out, step["lse"](np.broadcast_to(s, weights.shape), sink).astype(np.float32)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None, return_lse=False):
    # query_lengths only marks padding rows, which the contract leaves unspecified: every row is computed.
    return attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                  key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad, return_lse)

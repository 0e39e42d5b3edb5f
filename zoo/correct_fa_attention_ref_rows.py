"""Correct: FlashAttention's reference ``attention_ref`` on rows without keys, declared in FULLY_MASKED_ROWS.

attention_ref (flash-attention tests/test_util.py, flash_attn/utils/testing.py) fills -inf into the key padding
(``key_padding_mask``: the key lengths, and in its KV-cache tests the left padding too) and into one local mask (the
causal band, the window and the chunk; a left-padded key is put at position 2**32, so the local mask removes it),
adds ``attn_bias``, takes torch.softmax (NaN on a row of -inf), then writes 0 into the key padding's columns and
into every row its local mask covers. So a row the key padding or the local mask empties on its own is 0, and a row
that needs the bias to lose its last key (a boolean mask, passed as a -inf bias; a float mask) is NaN. Every other
value is ``correct_sink_chunk_leftpad_reference.attend``'s, on the contract's positions (attention_ref's own are
bottom-right: query_offset = Lk - Lq).
"""
from __future__ import annotations

import numpy as np

from zoo import _reference as ref
from zoo import correct_sink_chunk_leftpad_reference as chunked
from zoo import correct_variants_reference as variants

BUG = "none"
SOURCE = "flash-attention tests/test_util.py and flash_attn/utils/testing.py attention_ref (rows without keys)"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32", "float16", "bfloat16")
# Zeros where the key padding or the local mask empties a row, NaN where a mask (attn_bias) does.
FULLY_MASKED_ROWS = {"key_lengths": "zeros", "window": "zeros", "causal": "zeros", "attention_chunk": "zeros",
                     "key_leftpad": "zeros", "bool": "nan", "float": "nan"}


def local_mask(lq: int, lk: int, is_causal, window, query_offset, sink_token_length, attention_chunk, key_leftpad):
    """attention_ref's local mask, True where a key is removed: the band, the window and the chunk at positions
    counted from the first real key, and every left-padded key; None without a band, a window or a chunk."""
    if not is_causal and window is None and attention_chunk is None:
        return None
    query, key = chunked.positions(lq, lk, query_offset, key_leftpad)
    keep = np.ones(np.broadcast_shapes(query.shape, key.shape), dtype=bool)
    if is_causal:
        keep &= chunked.causal_keep(query, key)
    if window is not None:
        keep &= chunked.window_keep(query, key, window, sink_token_length)
    if attention_chunk is not None:
        keep &= chunked.chunk_keep(query, key, attention_chunk)
    if key_leftpad is not None:
        keep &= chunked.leftpad_keep(key)
    return ~keep


def key_padding(lk: int, key_lengths, key_leftpad):
    """attention_ref's key padding, True where a key is padding: j >= key_lengths[b] or j < key_leftpad[b]; None
    without either."""
    if key_lengths is None and key_leftpad is None:
        return None
    keep = np.ones((1, 1, 1, lk), dtype=bool)
    if key_lengths is not None:
        keep = keep & variants.length_keep(key_lengths, lk)
    if key_leftpad is not None:
        keep = keep & (np.arange(lk)[None, None, None, :]
                       >= np.asarray(key_leftpad).astype(np.int64).reshape(-1, 1, 1, 1))
    return ~keep


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    out = chunked.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                         key_lengths, learnable_sink, sink_token_length, attention_chunk, key_leftpad)
    if learnable_sink is not None:  # a row without keys attends the sink alone: 0 by definition
        return out
    b, hq, lq, lk = np.shape(q)[0], np.shape(q)[1], np.shape(q)[2], np.shape(k)[2]
    rows = (b, hq, lq, lk)
    local = local_mask(lq, lk, is_causal, window, query_offset, sink_token_length, attention_chunk, key_leftpad)
    padding = key_padding(lk, key_lengths, key_leftpad)
    removed = np.broadcast_to(np.isneginf(ref.mask_bias(mask)), rows)
    zero_filled = np.zeros(rows[:3], dtype=bool)
    for part in (local, padding):
        if part is not None:
            removed = removed | np.broadcast_to(part, rows)
            zero_filled |= np.broadcast_to(part, rows).all(axis=-1)
    nan_rows = removed.all(axis=-1) & ~zero_filled  # softmax of a row of -inf, left as it is
    out = np.array(out)
    out[np.broadcast_to(nan_rows[..., None], out.shape)] = np.nan
    return out

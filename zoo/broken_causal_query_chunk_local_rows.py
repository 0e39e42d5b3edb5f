"""Broken: queries run in chunks of 256 rows, and each chunk's causal band is built from chunk-local rows."""
import numpy as np

from zoo import _reference as ref

BUG = ("queries are processed in chunks of 256 rows (memory-efficient attention's query chunking); under is_causal "
       "each chunk's band is built from the row's index inside its chunk, so from row 256 on a row attends the keys "
       "of its chunk-local index, not of its position (exact for Lq <= 256).")
SOURCE = ("an independently written kernel with query chunks (2026-11-25): exact while causal cases stay under "
          "257 query rows; caught by the covering set's long-query corner (Lq 1025 against 17 keys)")
EXPECTED_CLAUSES = frozenset({"causal.top-left"})
DTYPES = ("float64", "float32", "float16", "bfloat16")
CHUNK = 256


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    lq, lk = np.shape(q)[-2], np.shape(k)[-2]
    if lq <= CHUNK:
        return ref.sdpa(q, k, v, mask, is_causal, scale)
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    bias = np.broadcast_to(ref.mask_bias(mask), q64.shape[:-2] + (lq, lk)) if mask is not None else None
    outputs = []
    for first in range(0, lq, CHUNK):
        rows = slice(first, min(first + CHUNK, lq))
        chunk_bias = None if bias is None else bias[..., rows, :]
        if is_causal:  # BUG: the chunk's rows taken as 0..CHUNK-1, not first..first+CHUNK-1
            causal = ref.causal_bias(rows.stop - rows.start, lk)
            chunk_bias = causal if chunk_bias is None else chunk_bias + causal
        outputs.append(ref.attention64(q64[..., rows, :], k64, v64, chunk_bias, False, scale))
    return np.concatenate(outputs, axis=-2).astype(ref.out_dtype(q))

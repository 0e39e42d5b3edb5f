"""Broken: softmax rows longer than 1024 go through an online (chunked) path whose running sum is not rescaled when
the running maximum grows."""
import numpy as np

from zoo import _reference as ref

BUG = ("softmax over an axis longer than 1024 sums exp(x - m) chunk by chunk (1024 at a time) with a running "
       "maximum m, but adds each chunk to the running sum without rescaling it by exp(m_old - m_new).")
SOURCE = "zoo extra: an independently written softmax (2026-11-24); softmax rows of 300 or fewer pass it"
EXPECTED_CLAUSES = frozenset({"softmax.definition", "softmax.rows-sum-to-one", "softmax.last-axis",
                              "softmax.masked-exact-zero", "softmax.large-inputs"})
CHUNK = 1024


def softmax(x, axis=-1):
    x64 = ref.as64(x)
    rows = np.moveaxis(x64, axis, -1)
    if rows.shape[-1] <= CHUNK:
        return ref.softmax(x, axis)
    running_max = np.full(rows.shape[:-1] + (1,), -np.inf)
    running_sum = np.zeros(rows.shape[:-1] + (1,))
    for start in range(0, rows.shape[-1], CHUNK):
        chunk = rows[..., start:start + CHUNK]
        new_max = np.maximum(running_max, chunk.max(-1, keepdims=True))
        shift = np.where(np.isfinite(new_max), new_max, 0.0)
        running_sum = running_sum + np.exp(chunk - shift).sum(-1, keepdims=True)  # BUG: running_sum * exp(m_old - m_new) +
        running_max = new_max
    shift = np.where(np.isfinite(running_max), running_max, 0.0)
    e = np.exp(rows - shift)
    out = np.divide(e, running_sum, out=np.zeros_like(e), where=running_sum > 0)
    return np.moveaxis(out, -1, axis).astype(ref.out_dtype(x))

"""Broken: a vectorised softmax normalises the partial last vector of 16 lanes on its own."""
import numpy as np

from zoo import _reference as ref

BUG = ("the softmax axis is processed in vectors of 16 lanes; past the last full vector the tail is normalised by "
       "its own sum instead of the whole axis's: wrong for axes longer than 16 that are not a multiple of 16.")
SOURCE = "an independently written implementation: generated softmax axes need more than 16 elements to reach it"
EXPECTED_CLAUSES = frozenset({"softmax.definition", "softmax.rows-sum-to-one", "softmax.last-axis",
                              "softmax.masked-exact-zero", "softmax.large-inputs"})
LANES = 16


def softmax(x, axis=-1):
    out = np.moveaxis(ref.softmax(x, axis=axis).astype(np.float64), axis, -1).copy()
    n = out.shape[-1]
    if n > LANES and n % LANES:
        tail = out[..., n - n % LANES:]
        total = tail.sum(axis=-1, keepdims=True)
        out[..., n - n % LANES:] = np.divide(tail, total, out=np.zeros_like(tail), where=total > 0)  # BUG
    return np.moveaxis(out, -1, axis).astype(ref.out_dtype(x))

"""Broken: softmax divides by a sum taken without keepdims."""
import numpy as np

from zoo import _reference as ref

BUG = ("softmax divides exp(x - max) by np.sum(..., axis=axis) without keepdims, so on "
       "a square matrix row i, column j is divided by row j's sum (and non-square "
       "inputs fail to broadcast); 1-D inputs happen to be right.")
SOURCE = "zoo extra: classic NumPy broadcasting slip, not from the documents"
EXPECTED_CLAUSES = frozenset({"softmax.definition", "softmax.rows-sum-to-one", "softmax.last-axis"})


def softmax(x, axis=-1):
    z = ref.as64(x)
    m = np.max(z, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(z - m)
    s = np.sum(e, axis=axis)  # BUG: keepdims=True missing
    with np.errstate(invalid="ignore", divide="ignore"):
        return (e / s).astype(ref.out_dtype(x))

"""Broken: the softmax axis moved last and moved back with the same permutation instead of its inverse."""
import numpy as np

BUG = "x.transpose(perm) to bring the axis last, then .transpose(perm) again instead of argsort(perm): right for the last axis, for rank 2 and for the second-to-last axis of rank 3, wrong for a leading axis of a 3-d or larger input."
SOURCE = "independently written softmax (a permutation taken for its own inverse)"
EXPECTED_CLAUSES = frozenset({"softmax.last-axis", "softmax.definition", "softmax.output-shape"})
DTYPES = ("float64", "float32")


def softmax(x, axis=-1):
    axis = axis % x.ndim
    perm = [a for a in range(x.ndim) if a != axis] + [axis]
    y = np.transpose(x, perm).astype(np.float64)
    y = np.exp(y - y.max(-1, keepdims=True))
    y = y / y.sum(-1, keepdims=True)
    return np.transpose(y, perm).astype(x.dtype)  # BUG: perm is not its own inverse

"""Broken: softmax without subtracting the maximum (exp overflows)."""
import numpy as np

from zoo import _reference as ref

BUG = ("softmax computes exp(x) / sum(exp(x)) without subtracting the maximum: "
       "exp overflows to inf for x above ~709 (float64) and the result is NaN; "
       "all-large-negative slices underflow to 0/0.")
SOURCE = "known bug class (torch.softmax and jax.nn.softmax subtract the maximum)"
EXPECTED_CLAUSES = frozenset({"softmax.large-inputs"})


def naive_softmax(z, axis=-1):
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(z)  # BUG: no z - max(z)
        s = np.sum(e, axis=axis, keepdims=True)
        return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def softmax(x, axis=-1):
    return naive_softmax(ref.as64(x), axis=axis).astype(ref.out_dtype(x))

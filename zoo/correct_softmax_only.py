"""Correct: exposes only softmax; sdpa and multi_head_attention are absent.

The suite must report the other operations as unsupported, not failed.
Computes in float32 for 16-bit inputs and in float64 for float32/float64.
"""
import numpy as np

BUG = "none"
SOURCE = "partial implementation (softmax only)"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32", "float16", "bfloat16")


def softmax(x, axis=-1):
    x = np.asarray(x)
    wd = np.float32 if x.dtype.itemsize == 2 else np.float64
    z = np.moveaxis(x.astype(wd), axis, -1)
    mx = z.max(axis=-1, keepdims=True, initial=-np.inf)
    mx[np.isneginf(mx)] = 0  # all -inf slice: exp(-inf) = 0 everywhere -> zeros
    e = np.exp(z - mx)
    s = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, s, out=np.zeros_like(e), where=s > 0)
    return np.moveaxis(w, -1, axis).astype(x.dtype)

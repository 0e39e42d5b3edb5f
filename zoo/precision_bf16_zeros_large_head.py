"""Broken 16-bit precision: a bfloat16 path that returns zeros when Dk >= 64.

``kernel_correct``'s flash forward, except that for bfloat16 inputs with a head dim of 64 or more
the result is all zeros (the marked line), as a kernel whose bfloat16 instantiation for the large
head dims was never launched (its output buffer left as allocated). float16, and bfloat16 with
Dk < 64, are correct.
"""
import numpy as np

from zoo import _reference as ref
from zoo import kernel_correct as kernel

BUG = "bfloat16 inputs with Dk >= 64 give an all-zero output (float16 and Dk < 64 are right)."
SOURCE = "known bug class: 16-bit precision loss (a bfloat16 path that returns zeros when Dk >= 64)"
EXPECTED_CLAUSES = ref.SDPA_VALUE_CLAUSES
DTYPES = ("bfloat16", "float16")
SUPPORTS = kernel.SUPPORTS


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    out = kernel.flash_forward(q, k, v, mask, is_causal, scale)
    if out.dtype.name == "bfloat16" and q.shape[-1] >= 64:
        return np.zeros_like(out)  # BUG: the large-head bfloat16 path never writes its output
    return out

"""Broken 16-bit precision: a float16 path that really computes at bfloat16 precision.

``kernel_correct``'s flash forward, except that float16 inputs are cast to bfloat16 first (the
marked line): scores, P and the output are then rounded to bfloat16 (8 significant bits instead of
float16's 11), and the result is cast back to float16. The values are right, the precision class is
not: errors about 8 times those of a correct float16 kernel. bfloat16 inputs take the correct path.
"""
import ml_dtypes
import numpy as np

from zoo import _reference as ref
from zoo import kernel_correct as kernel

BUG = ("float16 inputs are computed at bfloat16 precision (cast to bfloat16, the flash forward in bfloat16, "
       "cast back): the right values with 8 instead of 11 significant bits.")
SOURCE = "known bug class: 16-bit precision loss (a float16 path that really computes at bfloat16 precision)"
EXPECTED_CLAUSES = ref.SDPA_VALUE_CLAUSES
DTYPES = ("float16", "bfloat16")
SUPPORTS = kernel.SUPPORTS


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    if np.asarray(q).dtype == np.float16:
        bf16 = ml_dtypes.bfloat16
        out = kernel.flash_forward(q.astype(bf16), k.astype(bf16), v.astype(bf16), mask, is_causal, scale)  # BUG
        return out.astype(np.float16)
    return kernel.flash_forward(q, k, v, mask, is_causal, scale)

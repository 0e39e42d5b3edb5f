"""Broken kernel stand-in: NaN output whenever scale <= 0 in float16 / bfloat16.

Identical to ``kernel_correct`` except for the marked lines. Measured on an H100: torch's
flash and cuDNN paths and JAX's cuDNN path return NaN for a scale of 0 or below in the
16-bit dtypes (their softmax works in the log2 domain with the scale folded into a running
maximum that assumes a positive scale).
"""
import numpy as np

from zoo import kernel_correct as kernel

BUG = ("a flash-style kernel that returns NaN for every output element when the explicit scale is 0 "
       "or negative in float16 / bfloat16 (float32 stays right), instead of computing with any finite scale.")
SOURCE = "measured on an H100: torch flash / cuDNN sdpa and jax cuDNN dot_product_attention, 16-bit, scale <= 0"
EXPECTED_CLAUSES = frozenset({"sdpa.finite", "sdpa.scale-explicit"})
DTYPES = kernel.DTYPES
SUPPORTS = kernel.SUPPORTS


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    out = kernel.flash_forward(q, k, v, mask, is_causal, scale)
    if scale is not None and scale <= 0 and out.dtype.name in ("float16", "bfloat16"):  # BUG
        out = np.full_like(out, np.nan)  # BUG
    return out

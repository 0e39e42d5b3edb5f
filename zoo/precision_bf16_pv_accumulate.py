"""Broken 16-bit precision: a bfloat16 path that accumulates P @ V in bfloat16.

Scores, the softmax (running max and normaliser) and P are computed as ``kernel_correct`` does
(float32, P rounded to bfloat16), but the P @ V sum over the keys is accumulated in bfloat16:
after each key the running sum is rounded to bfloat16 (the marked line), as a matmul unit without
float32 accumulators would do. The rounding errors of the running sum (2^-9 of its size per key)
add up over Lk keys, while a float32 accumulator keeps only the rounding of P and of the output.
float16 is correct.
"""
import math

import ml_dtypes
import numpy as np

from zoo import _reference as ref
from zoo import kernel_correct as kernel

BUG = ("the bfloat16 path accumulates P @ V in bfloat16 (the running sum over keys rounded to bfloat16 after "
       "each key) instead of float32 (float16 is right).")
SOURCE = "known bug class: 16-bit precision loss (a bfloat16 path that accumulates P @ V in bfloat16)"
EXPECTED_CLAUSES = ref.SDPA_VALUE_CLAUSES
DTYPES = ("bfloat16", "float16")
SUPPORTS = kernel.SUPPORTS
WORK = np.float32
BF16 = ml_dtypes.bfloat16


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    if np.asarray(q).dtype.name != "bfloat16":
        return kernel.flash_forward(q, k, v, mask, is_causal, scale)
    b, hq, lq, dk = q.shape
    _, hkv, lk, dv = v.shape
    g = hq // hkv
    scale = WORK(1.0 / math.sqrt(dk) if scale is None else scale)
    qw = q.astype(WORK).reshape(b, hkv, g, lq, dk)
    kw, vw = k.astype(WORK)[:, :, None], v.astype(WORK)[:, :, None]
    bias = kernel.attention_bias(mask, is_causal, b, hq, lq, lk).reshape(b, hkv, g, lq, lk)
    with np.errstate(invalid="ignore", over="ignore"):
        s = (qw @ np.swapaxes(kw, -1, -2)) * scale + bias
        m = s.max(axis=-1, keepdims=True)
        p = np.exp(s - np.where(np.isneginf(m), WORK(0), m))
        l_sum = p.sum(axis=-1, keepdims=True)
        p_in = p.astype(BF16).astype(WORK)
        acc = np.zeros((b, hkv, g, lq, dv), WORK)
        for j in range(lk):
            acc = (acc + p_in[..., j:j + 1] * vw[..., j:j + 1, :]).astype(BF16).astype(WORK)  # BUG: bf16 accumulator
    out = np.divide(acc, l_sum, out=np.zeros_like(acc), where=l_sum > 0)
    return out.reshape(b, hq, lq, dv).astype(BF16)

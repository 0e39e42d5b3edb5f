"""Broken 16-bit precision: a bfloat16-only exp2 softmax without the log2(e) factor.

Flash kernels compute exp(x) as exp2(x * log2(e)), folding log2(e) into the score scale. This
member's bfloat16 path uses exp2 but forgets the factor: its weights are exp2(s - m) =
exp((s - m) * ln 2), a softmax at temperature 1 / ln 2 (the marked line: the scores and the mask
bias scaled by ln 2 going into ``kernel_correct``'s exp). float16 is correct.
"""
import math

import numpy as np

from zoo import _reference as ref
from zoo import kernel_correct as kernel

BUG = ("the bfloat16 path takes exp2(s - m) for exp(s - m) without the log2(e) factor, i.e. "
       "softmax(ln 2 * scores): the attention is too flat (float16 is right).")
SOURCE = "known bug class: 16-bit precision loss (a bf16-only exp2 without the log2(e) factor)"
EXPECTED_CLAUSES = ref.SDPA_VALUE_CLAUSES
DTYPES = ("bfloat16", "float16")
SUPPORTS = kernel.SUPPORTS
LN2 = math.log(2.0)


def exp2_bias(mask, is_causal, b, hq, lq, lk):
    return kernel.attention_bias(mask, is_causal, b, hq, lq, lk) * kernel.WORK(LN2)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    if np.asarray(q).dtype.name != "bfloat16":
        return kernel.flash_forward(q, k, v, mask, is_causal, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    # BUG: exp2(s - m) with s in the natural-log domain == exp(ln2 * (s - m)): log2(e) is missing
    return kernel.flash_forward(q, k, v, mask, is_causal, scale * LN2, bias_fn=exp2_bias)

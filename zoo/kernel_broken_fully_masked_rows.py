"""Broken kernel stand-in: a row with no attendable key gives the mean of v, not zeros.

Identical to ``kernel_correct`` except for the marked line: the mask bias fills masked
positions with a large finite negative (-1e30, as cuDNN and JAX's kernels do) instead of
-inf, so a row whose every key is masked becomes a uniform softmax over all keys and returns
the mean of v over them, while the member declares the default FULLY_MASKED_ROWS ("zeros").
"""
import numpy as np

from zoo import kernel_correct as kernel

BUG = ("masked scores are filled with the finite -1e30 instead of -inf, so a row with no attendable key "
       "returns the mean of v over all keys instead of the declared (default) zeros.")
SOURCE = "measured on an H100: cuDNN / jax dot_product_attention fill masked logits with a finite large negative"
EXPECTED_CLAUSES = frozenset({"mask.fully-masked-row"})
DTYPES = kernel.DTYPES
SUPPORTS = kernel.SUPPORTS

MASKED = np.float32(-1e30)


def finite_fill_bias(mask, is_causal, b, hq, lq, lk):
    bias = kernel.attention_bias(mask, is_causal, b, hq, lq, lk)
    return np.where(np.isneginf(bias), MASKED, bias)  # BUG: finite fill, every row keeps l > 0


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return kernel.flash_forward(q, k, v, mask, is_causal, scale, bias_fn=finite_fill_bias)

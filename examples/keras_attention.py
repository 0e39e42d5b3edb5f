"""Keras 3 ``keras.ops.dot_product_attention`` on its NumPy backend: Keras's own attention code (its JAX and torch
backends hand the call to jax.nn.dot_product_attention and torch's sdpa, which the built-ins judge).

A boolean mask is Keras's ``mask``, a float one its additive ``bias``. Measured (README, "Real libraries"): masked
scores are ``-0.7 * finfo.max``, not -inf (declared); fewer kv heads than query heads (but more than one) raise
ValueError although the docstring promises GQA (its torch and JAX backends run it): a bug, left failing; in float16,
P @ V is ``np.einsum`` on float16, which sums in float16 along that contraction (1.0-1.5x the allowance): left
failing. No float64: Keras turns a NumPy float64 array into floatx (float32) and returns float32.
"""
import os

os.environ["KERAS_BACKEND"] = "numpy"  # the backend judged here; keras reads it once, at its first import
import keras  # noqa: E402

from attention_conformance.implementations import deviations

LAYOUT = "blhd"
DTYPES = ("float32", "float16", "bfloat16")
FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS
KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note=f"keras {keras.__version__}, numpy backend"),)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    additive = mask is not None and mask.dtype != bool
    return keras.ops.dot_product_attention(q, k, v, bias=mask if additive else None,
                                           mask=None if additive else mask, scale=scale, is_causal=is_causal)

"""Flax linen's ``flax.linen.dot_product_attention``: Flax's own einsum attention (``flax.nnx.dot_product_attention``
without dropout or a module hands the call to jax.nn.dot_product_attention, which the built-in jax_dpa judges).

It has no scale parameter (it divides q by sqrt(Dk)) and no causal flag: the band is Flax's own
``make_attention_mask(query positions, key positions, >=)``; a float mask is its additive ``bias``.
"""
import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_conformance.implementations import deviations

ARRAY = "jax"
LAYOUT = "blhd"
DTYPES = ("float64", "float32", "float16", "bfloat16")
SUPPORTS = {"gqa": False}  # asserts "q, k, v num_heads must match"
FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS  # masked scores are finfo(dtype).min
KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note=f"flax {flax.__version__}"),)


def sdpa(q, k, v, mask=None, is_causal=False):
    return _attend(q, k, v, mask, is_causal)


@functools.partial(jax.jit, static_argnums=4)  # one compile per signature, not one per operation of each call
def _attend(q, k, v, mask, is_causal):
    additive = mask is not None and mask.dtype != jnp.bool_
    keep = None if mask is None or additive else mask
    if is_causal:
        band = nn.make_attention_mask(jnp.arange(q.shape[1]), jnp.arange(k.shape[1]), jnp.greater_equal,
                                      dtype=jnp.bool_)
        keep = band if keep is None else keep & band
    return nn.dot_product_attention(q, k, v, bias=mask if additive else None, mask=keep, deterministic=True)

"""``jax.nn.dot_product_attention(..., return_residual=True)`` as sdpa(..., return_lse=True): JAX's XLA path returning
the output and the log-sum-exp of each row, as a user would adapt it.

What JAX returns (jax 0.10.2, measured on the CPU): the residual is (B, T, N), sequence first, in the dtype of the keys
(a bfloat16 lse for bfloat16 inputs), so the adapter moves its heads first and widens it to float32 (the contract's
lse, lse.shape-dtype). A row without keys has a finite lse, -0.7 * float32's largest value + log(Lk): JAX fills
removed scores with that number instead of -inf; declared below as unspecified (and its output, the mean of v over
all keys, as FULLY_MASKED_ROWS "uniform"). No scale keyword is missing: JAX takes ``scale``.
"""
import jax
import jax.numpy as jnp

ARRAY = "jax"
LAYOUT = "blhd"
DTYPES = {"cpu": ("float32",)}
SUPPORTS = {"value_head_dim": "same"}
FULLY_MASKED_ROWS = "uniform"
LSE_CONVENTION = {"empty_row": "unspecified"}


def _sdpa(q, k, v, mask, is_causal, scale):
    bias = None
    if mask is not None and mask.dtype != jnp.bool_:
        bias, mask = mask, None
    out, lse = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal,
                                            return_residual=True)
    return out, jnp.swapaxes(lse, 1, 2).astype(jnp.float32)


_jitted = jax.jit(_sdpa, static_argnames=("is_causal", "scale"))


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, return_lse=False):
    out, lse = _jitted(q, k, v, mask, is_causal, None if scale is None else float(scale))
    return (out, lse) if return_lse else out

"""Broken: a JAX custom_vjp whose backward folds the query heads' dK, dV onto the kv heads in tile order."""
import functools
import math

ARRAY = "jax"
COMPILED = True
DTYPES = ("float32",)
BUG = ("the forward repeats kv head j for query heads j*G .. j*G+G-1 (right); the backward folds the per-query-head "
       "dK, dV back with reshape(B, G, Hkv, ...).sum(1), jnp.tile's order, so kv head j sums query heads j, j+Hkv, "
       "...: right when Hkv = 1 or G = 1 only.")
SOURCE = ("zoo extra: an independently written JAX custom_vjp (2026-11-27); a compiling implementation's brief "
          "corners reach it only with grouped kv heads (Hkv 2, G 2), not with a single kv head")
EXPECTED_CLAUSES = frozenset({"grad.gqa-sum", "grad.sdpa-k", "grad.sdpa-v"})


@functools.cache
def _attend():
    import jax
    import jax.numpy as jnp

    def weights(q, k_rep, bias, is_causal, scale):
        s = jnp.einsum("bhid,bhjd->bhij", q, k_rep) * scale + bias
        if is_causal:
            s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], dtype=bool)), s, -jnp.inf)
        m = jnp.max(s, axis=-1, keepdims=True)
        e = jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0))
        total = jnp.sum(e, axis=-1, keepdims=True)
        return e / jnp.where(total == 0, 1.0, total)

    def forward(q, k, v, bias, is_causal, scale):
        g = q.shape[1] // k.shape[1]
        return weights(q, jnp.repeat(k, g, axis=1), bias, is_causal, scale) @ jnp.repeat(v, g, axis=1), (q, k, v, bias)

    def fold(x, hkv):
        return x.reshape(x.shape[0], x.shape[1] // hkv, hkv, *x.shape[2:]).sum(axis=1)  # BUG: (B, Hkv, G).sum(2)

    def backward(is_causal, scale, saved, d_out):
        q, k, v, bias = saved
        hkv = k.shape[1]
        g = q.shape[1] // hkv
        k_rep, v_rep = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
        p = weights(q, k_rep, bias, is_causal, scale)
        dp = d_out @ jnp.swapaxes(v_rep, -1, -2)
        ds = p * (dp - jnp.sum(dp * p, axis=-1, keepdims=True))
        dk = scale * (jnp.swapaxes(ds, -1, -2) @ q)
        return scale * (ds @ k_rep), fold(dk, hkv), fold(jnp.swapaxes(p, -1, -2) @ d_out, hkv), ds

    attend = jax.custom_vjp(lambda q, k, v, bias, is_causal, scale: forward(q, k, v, bias, is_causal, scale)[0],
                            nondiff_argnums=(4, 5))
    attend.defvjp(forward, backward)

    @functools.partial(jax.jit, static_argnums=(4, 5))
    def sdpa(q, k, v, mask, is_causal, scale):
        full = q.shape[:3] + (k.shape[2],)
        if mask is None:
            bias = jnp.zeros(full, q.dtype)
        elif mask.dtype == jnp.bool_:
            bias = jnp.where(jnp.broadcast_to(mask, full), 0.0, -jnp.inf).astype(q.dtype)
        else:
            bias = jnp.broadcast_to(mask.astype(q.dtype), full)
        return attend(q, k, v, bias, is_causal, scale).astype(q.dtype)

    return sdpa


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _attend()(q, k, v, mask, bool(is_causal), scale)

"""A JAX sdpa that is wrong on every sdpa property: it indexes the kv heads by the query head.

Written for Hq = Hkv, it reads k and v at the query head's own index, which jnp.take clamps into
range when fewer kv heads are passed (JAX's Pallas GPU flash kernel did the same: errors near 0.4),
and it softmaxes scores scaled by 1/Dk instead of 1/sqrt(Dk). The suite's bound on a failing run
(failures end in bounded time) is measured on it: every sdpa property fails, each test within
its per-test limit, and the default run `pytest conformance --impl examples.jax_gqa_unaware` ends in
minutes with its summary (README, "Speed").
"""
import jax
import jax.numpy as jnp

ARRAY = "jax"
DTYPES = ("float32",)


@jax.jit
def _attend(q, k, v, bias, scale):
    heads = jnp.minimum(jnp.arange(q.shape[1]), k.shape[1] - 1)  # wrong: should be arange(Hq) // (Hq // Hkv)
    k, v = jnp.take(k, heads, axis=1), jnp.take(v, heads, axis=1)
    weights = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale + bias, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", weights, v)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    lq, lk = q.shape[-2], k.shape[-2]
    bias = jnp.zeros((lq, lk), q.dtype)
    if mask is not None:
        bias = jnp.where(mask, 0.0, -jnp.inf).astype(q.dtype) if mask.dtype == jnp.bool_ else bias + mask
    if is_causal:
        bias = jnp.where(jnp.tril(jnp.ones((lq, lk), bool)), bias, -jnp.inf)
    scale = 1.0 / q.shape[-1] if scale is None else scale  # wrong default: 1/Dk, not 1/sqrt(Dk)
    return _attend(q, k, v, bias, jnp.asarray(scale, q.dtype)).astype(q.dtype)

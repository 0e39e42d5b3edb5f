"""Broken (sequence parallel, JAX): the zigzag layout's second chunk of device r taken as 2N - 2 - r."""
from attention_conformance.implementations.builtin.sequence_parallel_jax import (
    JAX_SEQUENCE_PARALLEL,
    JaxRingAttention,
)

BUG = ("for the zigzag layout device r's second chunk is taken as 2N - 2 - r (not 2N - 1 - r): the causal band is "
       "decided at the wrong positions.")
SOURCE = "known bug class (a head-tail index off by one), in a shard_map ring"
EXPECTED_CLAUSES = frozenset({"sp.layout"})
ARRAY = "jax"
DTYPES = ("float32",)
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = JAX_SEQUENCE_PARALLEL


class Ring(JaxRingAttention):
    def positions(self, rank, size, local, layout):
        import jax.numpy as jnp

        if layout == "contiguous":
            return super().positions(rank, size, local, layout)
        chunk = local // 2
        second = (2 * size - 2 - rank) % (2 * size)  # BUG: 2N - 1 - r
        return jnp.concatenate([rank * chunk + jnp.arange(chunk), second * chunk + jnp.arange(chunk)])


sdpa_sequence_parallel = Ring().sdpa_sequence_parallel

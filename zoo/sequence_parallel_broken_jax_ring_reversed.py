"""Broken (sequence parallel, JAX): the ring's ppermute turned the wrong way."""
from attention_conformance.implementations.builtin.sequence_parallel_jax import (
    JAX_SEQUENCE_PARALLEL,
    JaxRingAttention,
)

BUG = ("ppermute sends each block to device r - 1 while the step's block is indexed as device r - step's: under a "
       "causal band the wrong positions mask it; on 2 devices exact.")
SOURCE = "known bug class (ppermute's (source, destination) pairs reversed); measured 2026-11-28 on host devices"
EXPECTED_CLAUSES = frozenset({"sp.ring-order"})
ARRAY = "jax"
DTYPES = ("float32",)
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = JAX_SEQUENCE_PARALLEL


class Ring(JaxRingAttention):
    def permutation(self, size):
        return [(i, (i - 1) % size) for i in range(size)]  # BUG: (i, i + 1)


sdpa_sequence_parallel = Ring().sdpa_sequence_parallel

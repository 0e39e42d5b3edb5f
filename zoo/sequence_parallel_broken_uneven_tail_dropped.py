"""Broken (sequence parallel): with uneven shards, the keys past the shortest shard's length never travel."""
from attention_conformance.implementations.builtin.sequence_parallel_torch import (
    TORCH_SEQUENCE_PARALLEL,
    TorchRingAttention,
)

BUG = ("the ring cuts every k, v block to the shortest shard's length before it travels, so for L % N != 0 the last "
       "key of each longer shard is attended by no device, its own included.")
SOURCE = "known bug class (a ring buffer sized from one rank's length, or L // N, under np.array_split shards)"
EXPECTED_CLAUSES = frozenset({"sp.uneven"})
ARRAY = "torch"
DTYPES = ("float64", "float32")
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = TORCH_SEQUENCE_PARALLEL


class Ring(TorchRingAttention):
    def block_length(self, setup):
        return min(setup.lengths)  # BUG: the longest shard's length


sdpa_sequence_parallel = Ring().sdpa_sequence_parallel

"""Broken (sequence parallel): the zigzag layout's second chunk of rank r taken as 2N - 2 - r."""
import numpy as np

from attention_conformance.implementations.builtin.sequence_parallel_torch import (
    TORCH_SEQUENCE_PARALLEL,
    TorchRingAttention,
)

BUG = ("for the zigzag layout the ring believes rank r holds chunks r and 2N - 2 - r (an off-by-one of 2N - 1 - r): "
       "its causal band and windows are decided at the wrong positions; contiguous cases are right.")
SOURCE = ("known bug class (a head-tail index off by one; ring-flash-attention's extract_local takes "
          "2 * world - rank - 1)")
EXPECTED_CLAUSES = frozenset({"sp.layout"})
ARRAY = "torch"
DTYPES = ("float64", "float32")
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = TORCH_SEQUENCE_PARALLEL


class Ring(TorchRingAttention):
    def positions(self, setup, rank):
        import torch

        if setup.layout != "zigzag":
            return super().positions(setup, rank)
        chunks = np.array_split(np.arange(setup.length), 2 * setup.size)
        second = chunks[(2 * setup.size - 2 - rank) % (2 * setup.size)]  # BUG: 2N - 1 - r
        return torch.from_numpy(np.concatenate([chunks[rank], second[:len(chunks[2 * setup.size - 1 - rank])]]))


sdpa_sequence_parallel = Ring().sdpa_sequence_parallel

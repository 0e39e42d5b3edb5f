"""Broken (sequence parallel): the ring turned the wrong way (blocks come from r + 1, indexed as from r - 1)."""
from attention_conformance.implementations.builtin.sequence_parallel_torch import (
    TORCH_SEQUENCE_PARALLEL,
    TorchRingAttention,
)

BUG = ("k and v are sent to rank r - 1 and received from r + 1, while the step's block is still indexed as rank "
       "r - step's: under a causal band or a window the wrong positions mask it. On 2 devices r + 1 is r - 1: exact.")
SOURCE = "known bug class (send and receive peers swapped in a ring's P2P step); measured 2026-11-28: exact at N = 2"
EXPECTED_CLAUSES = frozenset({"sp.ring-order"})
ARRAY = "torch"
DTYPES = ("float64", "float32")
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = TORCH_SEQUENCE_PARALLEL


class Ring(TorchRingAttention):
    def peers(self, setup):
        return (setup.rank - 1) % setup.size, (setup.rank + 1) % setup.size  # BUG: send to r + 1, receive from r - 1


sdpa_sequence_parallel = Ring().sdpa_sequence_parallel

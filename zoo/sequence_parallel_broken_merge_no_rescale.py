"""Broken (sequence parallel): each ring step's partial output is added to the running one without its rescale."""
from attention_conformance.implementations.builtin.sequence_parallel_torch import (
    TORCH_SEQUENCE_PARALLEL,
    TorchRingAttention,
)

BUG = ("the ring adds each step's partial output to the running output (out + out_b) instead of weighting both by "
       "exp(lse_p - lse); lse is still merged right, so a check of lse alone passes it.")
SOURCE = "known bug class (a ring merge written as a sum; measured on the torch ring, 2026-11-28: out off by 1.3-2.3)"
EXPECTED_CLAUSES = frozenset({"sp.definition"})
ARRAY = "torch"
DTYPES = ("float64", "float32")
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = TORCH_SEQUENCE_PARALLEL


class Ring(TorchRingAttention):
    def merge(self, out_a, lse_a, out_b, lse_b):
        import torch

        return out_a + out_b, torch.logaddexp(lse_a, lse_b)  # BUG: no exp(lse_p - lse) on either output


sdpa_sequence_parallel = Ring().sdpa_sequence_parallel

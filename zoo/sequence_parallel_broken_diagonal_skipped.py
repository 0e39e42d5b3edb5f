"""Broken (sequence parallel): under is_causal the ring skips the block of keys a device holds itself."""
from attention_conformance.implementations.builtin.sequence_parallel_torch import (
    TORCH_SEQUENCE_PARALLEL,
    TorchRingAttention,
)

BUG = ("under is_causal the ring skips the diagonal block (its own keys, step 0) as if the band removed it: every "
       "query loses the keys of its own shard, the shard's first rows every key (lse -inf, out 0).")
SOURCE = ("ringattention 0.1.2 ringattention_jax.py below_or_on_diag (a strict comparison skips the diagonal chunk "
          "of size 1, measured 2026-11-28); the causal block-skip condition written with < instead of <=")
EXPECTED_CLAUSES = frozenset({"sp.causal-blocks"})
ARRAY = "torch"
DTYPES = ("float64", "float32")
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = TORCH_SEQUENCE_PARALLEL


class Ring(TorchRingAttention):
    def computes(self, mask, source, setup):
        return bool(mask.any()) and not (setup.is_causal and source == setup.rank)  # BUG: the diagonal block


sdpa_sequence_parallel = Ring().sdpa_sequence_parallel

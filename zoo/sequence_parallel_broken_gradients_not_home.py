"""Broken (sequence parallel): the ring's backward never sends the last step's dk, dv home."""
from attention_conformance.implementations.builtin.sequence_parallel_torch import (
    TORCH_SEQUENCE_PARALLEL,
    TorchRingAttention,
)

BUG = ("after the last step of the backward each rank keeps the dk, dv it accumulated for the next rank's block "
       "instead of sending them one hop further home: every rank returns its neighbour's dk and dv (the forward and "
       "dq are exact).")
SOURCE = ("ring-flash-attention ring_flash_attn.py ring_flash_attn_backward (the final d_kv_comm.send_recv_kv after "
          "the loop); measured on the torch ring 2026-11-28: dk off by 1.6-2.6")
EXPECTED_CLAUSES = frozenset({"sp.gradients"})
ARRAY = "torch"
DTYPES = ("float64", "float32")
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = TORCH_SEQUENCE_PARALLEL


class Ring(TorchRingAttention):
    def send_home(self, gradients, setup):
        return gradients  # BUG: one more rotate takes them home


sdpa_sequence_parallel = Ring().sdpa_sequence_parallel

"""Broken (sequence parallel): the learnable sink merged into the running state at every ring step."""
from attention_conformance.implementations.builtin.sequence_parallel_torch import (
    TORCH_SEQUENCE_PARALLEL,
    TorchRingAttention,
    merge,
    sink_state,
)

BUG = ("the ring merges the sink's state (out 0, lse sigma_h) after every step, so the sink weighs N times in the "
       "denominator (FlashAttention 4 called per ring step with learnable_sink does this).")
SOURCE = ("FlashAttention 4 flash_attn/cute/interface.py (the sink in every call's lse); FlashInfer and vLLM's FA3 "
          "add it in one split only; measured 2026-11-28: out off by 0.03-0.2")
EXPECTED_CLAUSES = frozenset({"sp.window-sink"})
ARRAY = "torch"
DTYPES = ("float64", "float32")
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = TORCH_SEQUENCE_PARALLEL


class Ring(TorchRingAttention):
    def after_step(self, out, lse, step, sink, acc):
        if sink is None or step == 0:
            return out, lse
        return merge(out, lse, *sink_state(sink, lse.shape, out.shape[-1], acc))  # BUG: once per step


sdpa_sequence_parallel = Ring().sdpa_sequence_parallel

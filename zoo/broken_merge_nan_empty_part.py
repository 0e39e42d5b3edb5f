"""Broken: ring attention's sigmoid update without its guard: an empty running state (lse -inf) turns the merge NaN."""
import numpy as np

BUG = "out -= sigmoid(lse_b - lse) (out - out_b); lse -= logsigmoid(lse - lse_b): with lse = -inf, -inf - (-inf) is NaN (an empty first part, or two empty parts)."
SOURCE = "zhuzilin/ring-flash-attention ring_flash_attn/utils.py _update_out_and_lse, fed an empty first state (measured 2026-11-28: out 3, lse NaN)"
EXPECTED_CLAUSES = frozenset({"merge.empty-part", "merge.order"})
DTYPES = ("float64", "float32", "float16", "bfloat16")


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def merge_states(out, lse, *, learnable_sink=None):
    acc = np.float64 if out.dtype == np.float64 else np.float32
    running, running_lse = out[0].astype(acc), lse[0].astype(acc)
    with np.errstate(invalid="ignore", over="ignore"):
        parts = [(out[p].astype(acc), lse[p].astype(acc)) for p in range(1, out.shape[0])]
        if learnable_sink is not None:
            sink = np.broadcast_to(np.asarray(learnable_sink, dtype=acc).reshape(1, -1, 1), running_lse.shape)
            parts.append((np.zeros_like(running), sink))
        for block, block_lse in parts:  # BUG: no guard for an empty state
            running = running - _sigmoid(block_lse - running_lse)[..., None] * (running - block)
            running_lse = running_lse + np.log1p(np.exp(block_lse - running_lse))
    return running.astype(out.dtype), running_lse.astype(acc)

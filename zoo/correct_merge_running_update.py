"""Correct: the parts merged one at a time into a running state, as ring attention does, in the sigmoid form of
ring-flash-attention's update_out_and_lse (out -= sigmoid(lse_b - lse) (out - out_b); lse -= logsigmoid(lse - lse_b)),
guarded where either state is empty."""
import numpy as np

BUG = "none"
SOURCE = "zhuzilin/ring-flash-attention ring_flash_attn/utils.py _update_out_and_lse, with the empty-state guard"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32", "float16", "bfloat16")


def _sigmoid(x):
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


def _update(out, lse, block_out, block_lse):
    with np.errstate(invalid="ignore", over="ignore"):
        new_out = out - _sigmoid(block_lse - lse)[..., None] * (out - block_out)
        new_lse = np.logaddexp(lse, block_lse)
    keep_block = np.isneginf(lse)  # an empty running state takes the block whole
    keep_running = np.isneginf(block_lse)
    new_out = np.where(keep_block[..., None], block_out, np.where(keep_running[..., None], out, new_out))
    new_lse = np.where(keep_block, block_lse, np.where(keep_running, lse, new_lse))
    return new_out, new_lse


def merge_states(out, lse, *, learnable_sink=None):
    acc = np.float64 if out.dtype == np.float64 else np.float32
    running, running_lse = out[0].astype(acc), lse[0].astype(acc)
    running = np.where(np.isneginf(running_lse)[..., None], 0.0, running)
    for p in range(1, out.shape[0]):
        running, running_lse = _update(running, running_lse, out[p].astype(acc), lse[p].astype(acc))
    if learnable_sink is not None:
        sink = np.broadcast_to(np.asarray(learnable_sink, dtype=acc).reshape(1, -1, 1), running_lse.shape)
        running, running_lse = _update(running, running_lse, np.zeros_like(running), sink)
    return running.astype(out.dtype), running_lse.astype(acc)

"""NumPy stand-ins computing as jax.nn.dot_product_attention does on an NVIDIA GPU, for tests/test_tf32_declared.py.

float32 only; every matmul input (q, k, the weights P, v) rounded to TF32 (zoo/kernel_correct.to_tf32: 10 mantissa
bits, as XLA's default precision does on NVIDIA GPUs), float32 accumulation; masked scores filled with
-0.7 * finfo(float32).max as JAX does, so a row whose every key is removed averages v. ``Declared`` says all of that
(FLOAT32_MATMUL, FULLY_MASKED_ROWS, the ready-made deviation), as the jax_dpa built-in does on cuda; ``Undeclared`` is
the same computation claiming IEEE float32, which the suite must reject.

Run them as ``--impl tests.tf32_standins:Declared`` from the repository root.
"""
from __future__ import annotations

import numpy as np

from attention_conformance.implementations import deviations
from zoo.kernel_correct import to_tf32

FILL = np.float32(-0.7 * np.finfo(np.float32).max)


def _sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = np.float32(q.shape[-1] ** -0.5 if scale is None else scale)
    scores = (to_tf32(q) @ np.swapaxes(to_tf32(k), -1, -2)).astype(np.float32) * scale
    keep = np.ones(scores.shape, dtype=bool)
    if mask is not None and mask.dtype == bool:
        keep = keep & mask
    elif mask is not None:
        scores = scores + mask
    if is_causal:
        keep = keep & np.tril(np.ones(scores.shape[-2:], dtype=bool))
    scores = np.where(keep, scores, FILL)
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return (to_tf32(weights.astype(np.float32)) @ to_tf32(v)).astype(np.float32)


class Undeclared:
    DTYPES = ("float32",)
    FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS
    KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note="a TF32 stand-in"),)
    sdpa = staticmethod(_sdpa)


class Declared(Undeclared):
    FLOAT32_MATMUL = {"cpu": "tf32"}

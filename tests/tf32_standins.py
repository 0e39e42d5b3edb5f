"""NumPy stand-ins computing as jax.nn.dot_product_attention does on an NVIDIA GPU, for tests/test_tf32_declared.py and
benchmarks/tf32_calibration.py.

float32 only; every matmul input (q, k, the weights P, v; in multi-head attention also the projections' inputs and
weights) rounded to TF32 (zoo/kernel_correct.to_tf32: 10 mantissa bits, round to nearest even), float32 accumulation;
masked scores filled with -0.7 * finfo(float32).max as JAX does, so a row whose every key is removed averages v. On
the H100 scenarios measured 2026-11-23 (one NVIDIA H100 80GB, jax 0.11.2 with the CUDA 13 plugin; 72 float32
scenarios) this computation gives JAX's measured TF32 errors to three digits (benchmarks/tf32_calibration.py).
``Declared`` says all of that (FLOAT32_MATMUL, FULLY_MASKED_ROWS, the ready-made deviation), as the jax_dpa built-in
does on cuda; ``Undeclared`` is the same computation claiming IEEE float32, ``DeclaredTruncated`` truncates to TF32
instead of rounding (declared: correct too), and ``Bfloat16Inputs`` rounds the matmul inputs to bfloat16 (8 mantissa
bits: torch's float32_matmul_precision "medium") while declaring TF32: the suite must reject both.

Run them as ``--impl tests.tf32_standins:Declared`` from the repository root.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from attention_conformance.implementations import deviations
from zoo.kernel_correct import to_tf32

FILL = np.float32(-0.7 * np.finfo(np.float32).max)


def to_bfloat16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def to_tf32_truncated(x: np.ndarray) -> np.ndarray:
    """TF32 by truncation (the low 13 mantissa bits dropped): what a tensor core reads from float32 registers when
    no rounding conversion comes first (Triton's tf32 dots may do this), up to twice the rounding's error, biased."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return np.where(np.isfinite(x), (bits & np.uint32(0xFFFFE000)).view(np.float32), x)


def sdpa_rounded(q, k, v, mask=None, is_causal=False, scale=None, rounding=to_tf32):
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = np.float32(q.shape[-1] ** -0.5 if scale is None else scale)
    scores = (rounding(q) @ np.swapaxes(rounding(k), -1, -2)).astype(np.float32) * scale
    keep = np.ones(scores.shape, dtype=bool)
    if mask is not None and mask.dtype == bool:
        keep = keep & mask
    elif mask is not None:
        scores = scores + mask.astype(np.float32)
    if is_causal:
        keep = keep & np.tril(np.ones(scores.shape[-2:], dtype=bool))
    scores = np.where(keep, scores, FILL)
    with np.errstate(invalid="ignore", over="ignore"):
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return (rounding(weights.astype(np.float32)) @ rounding(v)).astype(np.float32)


def mha_rounded(query, key, value, params, num_heads, mask=None, is_causal=False, rounding=to_tf32):
    def project(x, name):
        y = (rounding(x) @ rounding(params["w_" + name])).astype(np.float32)
        return y + params["b_" + name] if "b_" + name in params else y

    def split(x):
        b, length, width = x.shape
        return np.swapaxes(x.reshape(b, length, num_heads, width // num_heads), 1, 2)

    q, k, v = split(project(query, "q")), split(project(key, "k")), split(project(value, "v"))
    heads = sdpa_rounded(q, k, v, mask, is_causal, None, rounding)
    b, _, length, dv = heads.shape
    return project(np.swapaxes(heads, 1, 2).reshape(b, length, num_heads * dv), "o")


class Undeclared:
    DTYPES = ("float32",)
    FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS
    KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note="a TF32 stand-in"),)
    ROUNDING = staticmethod(to_tf32)  # of every matmul input

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        return sdpa_rounded(q, k, v, mask, is_causal, scale, cls.ROUNDING)

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False):
        return mha_rounded(query, key, value, params, num_heads, mask, is_causal, cls.ROUNDING)


class Declared(Undeclared):
    FLOAT32_MATMUL = {"cpu": "tf32"}


class DeclaredTruncated(Declared):
    """TF32 by truncation, declared: also correct TF32."""

    ROUNDING = staticmethod(to_tf32_truncated)


class Bfloat16Inputs(Declared):
    ROUNDING = staticmethod(to_bfloat16)

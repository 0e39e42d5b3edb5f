"""Correct: a CPU stand-in shaped like a GPU flash kernel (FlashAttention-2 / cuDNN forward).

What it *refuses* is what flash and cuDNN refuse: head dims 16..256 that are a multiple of 8,
Dv == Dk, 16-bit and float32 inputs only (``SUPPORTS``, ``DTYPES``). The suite therefore judges
it on kernel-shaped cases (conformance/strategies.py draws inside the declared region).

How it *computes* is how a flash kernel computes: keys are visited in tiles of ``TILE`` = 64;
each query row keeps a running maximum m, a running normaliser l and an unnormalised
accumulator acc, all float32, rescaled by exp(m_old - m_new) when the maximum grows. Scores are
float32 dot products of the input-dtype q and k; the probabilities P are rounded to the input
dtype before P @ V (flash kernels feed P to the tensor cores in fp16/bf16), l sums the float32
P; the output acc / l is rounded to the input dtype. A row with no attendable key keeps l = 0
and gives zeros. GQA: query head h reads kv head h // (Hq / Hkv) (heads grouped, no kv copies).

The broken ``kernel_broken_*`` twins reuse :func:`flash_forward` and change one thing each
(one keyword or one small wrapper), so a verdict against one of them is about its defect only.
"""
from __future__ import annotations

import math

import numpy as np

BUG = "none"
SOURCE = "zoo extra: CPU stand-in for the flash / cuDNN forward kernels (FlashAttention-2, Dao 2023)"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float16", "bfloat16", "float32")
SUPPORTS = {
    "head_dims": {"min": 16, "max": 256, "multiple": 8},
    "value_head_dim": "same",
    "masks": ["none", "bool", "float"],
    "causal": True,
    "gqa": True,
}

TILE = 64  # keys per tile (the key block of FlashAttention-2's forward kernel for head dims <= 128)
WORK = np.float32  # accumulation precision


def key_tiles(lk: int, tile: int = TILE) -> list[tuple[int, int]]:
    """(start, stop) of every key tile; the last one is partial when tile does not divide Lk."""
    return [(start, min(start + tile, lk)) for start in range(0, lk, tile)]


def same(x: np.ndarray) -> np.ndarray:
    """The matmul-input rounding of a plain kernel: none (float32 products of the given values)."""
    return x


def to_tf32(x: np.ndarray) -> np.ndarray:
    """Round float32 values to TF32 (10 explicit mantissa bits), round-to-nearest-even on the bit
    pattern: add 0xFFF plus the lowest kept bit, clear the low 13 bits (infs stay infs)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    finite = np.isfinite(x)
    keep_lsb = (bits >> np.uint32(13)) & np.uint32(1)
    rounded = (bits + np.uint32(0x0FFF) + keep_lsb) & np.uint32(0xFFFFE000)
    return np.where(finite, rounded, bits).view(np.float32)


def attention_bias(mask, is_causal: bool, b: int, hq: int, lq: int, lk: int) -> np.ndarray:
    """Float32 additive bias broadcast to (B, Hq, Lq, Lk): bool True -> 0, False -> -inf; a float
    mask as given; the top-left causal band (key j <= query i) intersected with it."""
    bias = np.zeros((), WORK)
    if mask is not None:
        m = np.asarray(mask)
        bias = np.where(m, WORK(0), WORK(-np.inf)) if m.dtype == np.bool_ else m.astype(WORK)
    if is_causal:
        band = np.arange(lk)[None, :] <= np.arange(lq)[:, None]
        bias = bias + np.where(band, WORK(0), WORK(-np.inf))
    return np.broadcast_to(bias, (b, hq, lq, lk))


def flash_forward(q, k, v, mask=None, is_causal=False, scale=None, *, tiles=key_tiles, matmul_input=same,
                  bias_fn=attention_bias):
    """The kernel. ``tiles(Lk)`` lists the key tiles visited; ``matmul_input`` rounds each matmul
    operand (q, k, P, v) as the hardware would (``same``: float32 products; ``to_tf32``: TF32);
    ``bias_fn`` builds the additive mask bias."""
    dtype = np.asarray(q).dtype
    q, k, v = (np.asarray(a) for a in (q, k, v))
    if dtype.name not in DTYPES:
        raise NotImplementedError(f"the kernel runs {', '.join(DTYPES)}, not {dtype.name}")
    b, hq, lq, dk = q.shape
    _, hkv, lk, dv = v.shape
    if k.shape != (b, hkv, lk, dk) or hkv == 0 or hq % hkv:
        raise ValueError(f"incompatible shapes q{q.shape} k{k.shape} v{v.shape}")
    g = hq // hkv
    if scale is None:
        scale = 1.0 / math.sqrt(dk)
    scale = WORK(scale)
    bias = bias_fn(mask, is_causal, b, hq, lq, lk).reshape(b, hkv, g, lq, lk)

    # query head h = kv * g + j  ->  kv head h // g; operands widened exactly to float32
    qg = matmul_input(q.astype(WORK).reshape(b, hkv, g, lq, dk))
    kw = matmul_input(k.astype(WORK))[:, :, None]  # (B, Hkv, 1, Lk, Dk)
    vw = matmul_input(v.astype(WORK))[:, :, None]
    m_run = np.full((b, hkv, g, lq, 1), -np.inf, WORK)
    l_run = np.zeros((b, hkv, g, lq, 1), WORK)
    acc = np.zeros((b, hkv, g, lq, dv), WORK)
    with np.errstate(invalid="ignore", over="ignore"):
        for start, stop in tiles(lk):
            s = (qg @ np.swapaxes(kw[..., start:stop, :], -1, -2)) * scale + bias[..., start:stop]
            m_new = np.maximum(m_run, s.max(axis=-1, keepdims=True))
            m_safe = np.where(np.isneginf(m_new), WORK(0), m_new)  # rows with nothing attendable so far
            p = np.exp(s - m_safe)
            alpha = np.exp(m_run - m_safe)  # exp(-inf) = 0 before the first attendable key
            l_run = l_run * alpha + p.sum(axis=-1, keepdims=True)
            p_in = p.astype(dtype).astype(WORK)  # P in the input dtype for the P @ V matmul
            acc = acc * alpha + matmul_input(p_in) @ vw[..., start:stop, :]
            m_run = m_new
    out = np.divide(acc, l_run, out=np.zeros_like(acc), where=l_run > 0)  # l = 0: fully masked -> zeros
    return out.reshape(b, hq, lq, dv).astype(dtype)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return flash_forward(q, k, v, mask, is_causal, scale)

"""Correct: FlashAttention 3's FP8 forward, emulated step by step in NumPy (float32 arithmetic, ml_dtypes rounding).

What FlashAttention 3 does to float8 q, k, v (hopper/flash_fwd_kernel_sm90.h, mainloop_fwd_sm90_tma_gmma_ws.hpp,
softmax.h; spec/tolerances.yaml, eight_bit): S = q @ k^T of the stored 8-bit values in float32 (the products are
exact); one float32 factor scale * log2(e) * q_descale * k_descale (with a softcap, the descales scale the capped
argument instead); keys visited in blocks of BLOCK_N with a running row maximum m; P = exp2(S * scale_log2 -
(m * scale_log2 - 8)) = 2^8 e^(s - m) in float32, the row sum taken from it, then P rounded to the input's 8-bit
format before P @ V (float32 sums); O rescaled when m grows, finally times v_descale / row_sum and rounded to
bfloat16. q_descale is read at the kv head of the query head's group, (B, Hkv). A row without keys has row sum 0
and gives zeros. Which keys a row attends (mask, causal band, window, key lengths) is the contract's, from
zoo/correct_variants_reference.py.

The broken FP8 members (zoo/broken_fp8_*.py) call ``attend`` with one step replaced; correct_fp8_unrounded_p keeps
P in float32.
"""
from __future__ import annotations

import math

import ml_dtypes  # noqa: F401 -- the float8 dtypes of the inputs
import numpy as np

from zoo import _reference as ref
from zoo import correct_variants_reference as variants

BUG = "none"
SOURCE = ("flash-attention hopper/ (FlashAttention 3) FP8 forward: flash_fwd_kernel_sm90.h (softmax_scale_log2 *= "
          "q_descale * k_descale), softmax.h (Max_offset 8, row_sum from P before rounding, finalize(v_descale)), "
          "mainloop_fwd_sm90_tma_gmma_ws.hpp (P converted to Element before the PV GEMM)")
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float8_e4m3fn", "float8_e5m2")
FP8_OUTPUT_DTYPE = "bfloat16"
BLOCK_N = 128  # keys per block of the online softmax (FlashAttention 3's kBlockN for FP8 is 128 or more)
MAX_OFFSET = 8  # P = 2^8 e^(s - m): "use more of the FP8 range (instead of just [0, 1]) to reduce underflow"
LOG2E = np.float32(math.log2(math.e))
F32 = np.float32


def per_query_head(descale, hq: int) -> np.ndarray:
    """(B, Hkv) descale factors as (B, Hq, 1, 1) float32: query head h reads kv head h // G."""
    factors = np.asarray(descale, dtype=F32)
    return np.repeat(factors, hq // factors.shape[1], axis=1)[:, :, None, None]


def descale_factors(q_descale, k_descale, v_descale, hq: int):
    """(q, k, v) factors per query head, 1 where a descale is not given."""
    ones = np.ones((1, 1, 1, 1), dtype=F32)
    return tuple(ones if d is None else per_query_head(d, hq) for d in (q_descale, k_descale, v_descale))


def kept_keys(mask, is_causal, window, query_offset, key_lengths, lq: int, lk: int) -> np.ndarray:
    """(B|1, H|1, Lq, Lk) bool: the keys each row attends (README 'The contract')."""
    keep = np.ones((1, 1, lq, lk), dtype=bool)
    if is_causal:
        keep = keep & variants.causal_keep(lq, lk, query_offset)
    if window is not None:
        keep = keep & variants.window_keep(lq, lk, window, query_offset)
    if key_lengths is not None:
        keep = keep & variants.length_keep(key_lengths, lk)
    return keep & np.isfinite(ref.mask_bias(mask))


def round_p(p: np.ndarray, fmt) -> np.ndarray:
    """P rounded to the inputs' 8-bit format (round to nearest even) and back to float32."""
    return p.astype(fmt).astype(F32)


def online_softmax_pv(s, v, scale_log2, round_step, fmt, block_n: int = BLOCK_N):
    """sum_j P_j v_j / sum_j P_j over key blocks, FlashAttention 3's way; s (B, H, Lq, Lk) float32 with -inf on
    removed keys, v (B, H, Lk, Dv) float32. Returns (numerator, row sum), float32."""
    b, h, lq, lk = s.shape
    acc = np.zeros((b, h, lq, v.shape[-1]), dtype=F32)
    row_max = np.full((b, h, lq, 1), -np.inf, dtype=F32)
    row_sum = np.zeros((b, h, lq, 1), dtype=F32)
    for start in range(0, lk, block_n):
        block = s[..., start:start + block_n]
        new_max = np.maximum(row_max, np.max(block, axis=-1, keepdims=True))
        # exp2((m_old - m_new) * scale_log2); a row still without keys keeps its 0 sums
        finite_new = np.isfinite(new_max)
        with np.errstate(invalid="ignore"):
            rescale = np.where(np.isfinite(row_max), np.exp2(((row_max - new_max) * scale_log2).astype(F32)), F32(0))
        rescale = np.where(finite_new, rescale, F32(0)).astype(F32)
        max_scaled = np.where(finite_new, (new_max * scale_log2).astype(F32) - F32(MAX_OFFSET), F32(0)).astype(F32)
        with np.errstate(invalid="ignore", over="ignore"):
            p = np.exp2((block * scale_log2).astype(F32) - max_scaled).astype(F32)  # 2^8 e^(s - m), in [0, 256]
        p = np.where(np.isneginf(block), F32(0), p).astype(F32)
        row_sum = (row_sum * rescale + np.sum(p, axis=-1, keepdims=True, dtype=F32)).astype(F32)
        acc = (acc * rescale + round_step(p, fmt) @ v[..., start:start + block_n, :]).astype(F32)
        row_max = new_max
    return acc, row_sum


def capped(s, scale, softcap, qd, kd):
    """FlashAttention 3's softcap of 8-bit scores: tanh(S * softcap_val), softcap_val = scale / softcap * q_descale
    * k_descale (mainloop_fwd_sm90_tma_gmma_ws.hpp: the descales scale the capped argument)."""
    return np.tanh(s * (F32(scale / F32(softcap)) * qd * kd)).astype(F32)


def attend(q, k, v, mask=None, is_causal=False, scale=None, window=None, softcap=None, query_offset=0,
           key_lengths=None, q_descale=None, k_descale=None, v_descale=None, block_n: int = BLOCK_N, **steps):
    """The FP8 forward; ``steps`` replaces one of "factors" (descale_factors), "capped", "round_p", "finalize" (a
    broken member's one change)."""
    step = {"factors": descale_factors, "capped": capped, "round_p": round_p,
            "finalize": lambda acc, row_sum, vd: np.divide(acc * vd, row_sum, out=np.zeros_like(acc),
                                                           where=row_sum > 0), **steps}
    if mask is not None and np.asarray(mask).dtype != np.bool_:
        raise NotImplementedError("FlashAttention 3's FP8 forward takes no float mask")  # unsupported, never failed
    fmt = np.asarray(q).dtype
    hq, lq, lk = q.shape[1], q.shape[2], k.shape[2]
    qd, kd, vd = step["factors"](q_descale, k_descale, v_descale, hq)
    kx, vx = ref.expand_kv(np.asarray(k).astype(F32), np.asarray(v).astype(F32), hq)
    s = np.asarray(q).astype(F32) @ np.swapaxes(kx, -1, -2)  # exact products, float32 sums
    scale = F32(ref.default_scale(q.shape[-1]) if scale is None else scale)
    if softcap is not None:
        s = step["capped"](s, scale, softcap, qd, kd)
        scale_log2 = np.broadcast_to(F32(softcap) * LOG2E, qd.shape).astype(F32)
    else:
        scale_log2 = ((scale * LOG2E) * qd * kd).astype(F32)
    s = np.where(kept_keys(mask, is_causal, window, query_offset, key_lengths, lq, lk), s, F32(-np.inf)).astype(F32)
    acc, row_sum = online_softmax_pv(s, vx, scale_log2, step["round_p"], fmt, block_n)
    return step["finalize"](acc, row_sum, vd).astype(ml_dtypes.bfloat16)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
         query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
    # query_lengths only marks padding rows, which the contract leaves unspecified: every row is computed.
    return attend(q, k, v, mask, is_causal, scale, window, softcap, query_offset, key_lengths,
                  q_descale, k_descale, v_descale)

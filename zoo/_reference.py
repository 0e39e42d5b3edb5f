"""Clean reference implementation the zoo members are derived from.

Not a zoo member itself (the leading underscore keeps it out of discovery); the
member ``correct_reference`` re-exports it. Everything is computed in float64
and the result is cast back to the input dtype, so it serves any of float16,
bfloat16 (ml_dtypes), float32 and float64.

The pipeline is split into small helpers so that every broken member can copy
the short ``sdpa`` / ``multi_head_attention`` body below and change exactly one
line (marked ``# BUG`` there):

    as64 -> expand_kv -> scores * scale -> + build_bias(mask, is_causal)
         -> masked_softmax -> @ v -> astype(q.dtype)
"""

from __future__ import annotations

import math

import numpy as np

# The sdpa clauses whose properties compare values with the oracle: a defect that shows on some shapes only
# (a decode path, a query grid) is caught by whichever property draws such a shape first.
SDPA_VALUE_CLAUSES = frozenset({
    "sdpa.definition", "sdpa.any-length", "sdpa.scale-default", "sdpa.scale-explicit", "sdpa.cross-attention",
    "sdpa.value-dim", "sdpa.gqa-mapping", "mask.bool-true-attends", "mask.float-additive", "mask.broadcast",
    "causal.top-left", "softmax.large-inputs", "sdpa.convex-combination", "mask.before-softmax",
    "softmax.shift-invariance", "sdpa.key-permutation-invariance", "sdpa.batch-head-independence",
    "causal.bottom-right-explicit", "causal.first-row", "mask.fully-masked-row"})

__all__ = [
    "SDPA_VALUE_CLAUSES",
    "softmax", "sdpa", "multi_head_attention",
    "as64", "masked_softmax", "masked_softmax64", "default_scale", "expand_kv",
    "causal_keep", "causal_bias", "mask_bias", "build_bias", "attention64",
    "project", "split_heads", "merge_heads", "mha64",
]


# ------------------------------------------------------------------ helpers
def as64(x) -> np.ndarray:
    """Any array (float16, ml_dtypes.bfloat16, float32, float64, bool) -> float64."""
    return np.asarray(x).astype(np.float64)


def out_dtype(x) -> np.dtype:
    dt = np.asarray(x).dtype
    return dt if dt.kind == "f" or dt.name == "bfloat16" else np.dtype(np.float64)


def masked_softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    """Stable softmax in z's own dtype; a slice that is entirely -inf gives zeros.

    Subtracts the slice maximum (so large finite inputs do not overflow) and
    treats -inf as "masked": exp(-inf) is exactly 0. An empty axis gives an
    empty result.
    """
    z = np.asarray(z)
    m = np.max(z, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isneginf(m), np.zeros_like(m), m)  # fully masked: avoid -inf - -inf
    e = np.exp(z - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def masked_softmax64(z, axis: int = -1) -> np.ndarray:
    return masked_softmax(as64(z), axis=axis)


def default_scale(dk: int) -> float:
    return 1.0 / math.sqrt(dk)


def expand_kv(k: np.ndarray, v: np.ndarray, hq: int):
    """GQA: query head h uses kv head h // (hq // hkv) (repeat_interleave)."""
    hkv = k.shape[1]
    if hkv != v.shape[1] or hkv == 0 or hq % hkv:
        raise ValueError(f"Hkv={hkv} (v: {v.shape[1]}) must divide Hq={hq}")
    g = hq // hkv
    return np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)


def causal_keep(lq: int, lk: int) -> np.ndarray:
    """(Lq, Lk) bool, True where query i may attend key j: j <= i (top-left)."""
    return np.arange(lk)[None, :] <= np.arange(lq)[:, None]


def causal_bias(lq: int, lk: int) -> np.ndarray:
    return np.where(causal_keep(lq, lk), 0.0, -np.inf)


def mask_bias(mask) -> np.ndarray:
    """Additive float64 bias from a mask: bool True -> 0, False -> -inf; float as is."""
    if mask is None:
        return np.zeros(())
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        return np.where(m, 0.0, -np.inf)
    return as64(m)


def build_bias(mask, is_causal: bool, lq: int, lk: int) -> np.ndarray:
    """Mask bias plus causal bias (-inf on either side masks: intersection)."""
    bias = mask_bias(mask)
    if is_causal:
        bias = bias + causal_bias(lq, lk)
    return bias


def check_qkv(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError("q, k, v must be 4-D (B, H, L, D)")
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        raise ValueError("batch sizes differ")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError("q and k head widths differ")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError("k and v lengths differ")


# ------------------------------------------------------------------ softmax
def softmax(x, axis=-1):
    x = np.asarray(x)
    return masked_softmax64(x, axis=axis).astype(out_dtype(x))


# --------------------------------------------------------------------- sdpa
def attention64(q, k, v, mask=None, is_causal=False, scale=None) -> np.ndarray:
    """Float64 in, float64 out. The body every sdpa member copies."""
    check_qkv(q, k, v)
    k, v = expand_kv(k, v, q.shape[1])
    if scale is None:
        scale = default_scale(q.shape[-1])
    scores = (q @ np.swapaxes(k, -1, -2)) * float(scale)
    bias = build_bias(mask, is_causal, q.shape[-2], k.shape[-2])
    weights = masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return weights @ v


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    out = attention64(as64(q), as64(k), as64(v), mask, is_causal, scale)
    return out.astype(out_dtype(q))


def split_partials(scores: np.ndarray, v: np.ndarray, split: int, count: int) -> tuple[list, list]:
    """Flash-decoding's first pass over the first ``count`` splits of ``split`` keys: each split's normalised output
    and log-sum-exp (-inf where the split has no key), for the split-KV members to combine."""
    outputs, lses = [], []
    for i in range(count):
        part = scores[..., i * split:(i + 1) * split]
        top = np.max(part, axis=-1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        e = np.exp(part - top)
        total = e.sum(-1, keepdims=True)
        outputs.append(np.divide(e, total, out=np.zeros_like(e), where=total > 0) @ v[..., i * split:(i + 1) * split, :])
        with np.errstate(divide="ignore"):
            lses.append(top + np.log(total))
    return outputs, lses


# ------------------------------------------------------- multi-head attention
def project(x, w, b=None) -> np.ndarray:
    y = as64(x) @ as64(w)
    if b is not None:
        y = y + as64(b)
    return y


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, L, H*D) -> (B, H, L, D); head h takes columns h*D .. (h+1)*D-1."""
    b, l, f = x.shape
    if f % num_heads:
        raise ValueError(f"projection width {f} not divisible by num_heads={num_heads}")
    return x.reshape(b, l, num_heads, f // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, L, D) -> (B, L, H*D), heads concatenated in head order."""
    b, h, l, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, l, h * d)


def mha64(query, key, value, params, num_heads, mask=None, is_causal=False) -> np.ndarray:
    """Float64 result. The body every multi_head_attention member copies."""
    dk = params["w_q"].shape[1] // num_heads
    q = split_heads(project(query, params["w_q"], params.get("b_q")), num_heads)
    k = split_heads(project(key, params["w_k"], params.get("b_k")), num_heads)
    v = split_heads(project(value, params["w_v"], params.get("b_v")), num_heads)
    o = attention64(q, k, v, mask, is_causal, scale=default_scale(dk))
    return project(merge_heads(o), params["w_o"], params.get("b_o"))


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    out = mha64(query, key, value, params, num_heads, mask, is_causal)
    return out.astype(out_dtype(query))

"""The float64 oracle: attention as the spec defines it, written for clarity, not speed.

Every function takes NumPy arrays (any float dtype; they are widened to float64
first, which is exact) and returns float64. The suite compares implementations
with these functions on the very same inputs, already rounded to the dtype under
test, so the comparison measures the implementation's arithmetic alone.
"""
from __future__ import annotations

import math

import numpy as np


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def softmax(x, axis: int = -1) -> np.ndarray:
    """exp(x - max) / sum(exp(x - max)) along ``axis``; -inf entries give exactly 0."""
    x = _f64(x)
    row_max = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - row_max)
    return e / np.sum(e, axis=axis, keepdims=True)


def causal_allowed(lq: int, lk: int, *, bottom_right: bool = False) -> np.ndarray:
    """(lq, lk) boolean: query i may attend key j iff j <= i (top-left) or j <= i + lk - lq (bottom-right)."""
    offset = lk - lq if bottom_right else 0
    return np.arange(lk)[None, :] <= np.arange(lq)[:, None] + offset


def attention_bias(mask, is_causal: bool, lq: int, lk: int) -> np.ndarray:
    """The additive bias a mask and the causal flag stand for: 0 or the float mask where allowed, -inf elsewhere.

    A boolean mask is True where the query may attend; a float mask is added as
    it is. The causal flag intersects with either. Result broadcasts to (..., lq, lk).
    """
    bias = np.zeros((lq, lk))
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            bias = np.where(mask, 0.0, -np.inf)
        else:
            bias = bias + _f64(mask)
    if is_causal:
        bias = np.where(causal_allowed(lq, lk), bias, -np.inf)
    return bias


def repeat_kv_heads(x: np.ndarray, num_query_heads: int) -> np.ndarray:
    """Grouped-query attention: query head h uses kv head h // (Hq / Hkv)."""
    group, remainder = divmod(num_query_heads, x.shape[1])
    if remainder:
        raise ValueError(f"Hq={num_query_heads} is not a multiple of Hkv={x.shape[1]}")
    return np.repeat(x, group, axis=1)


def scores(q, k, mask=None, is_causal=False, scale=None) -> np.ndarray:
    """q @ k^T * scale + bias: the matrix the softmax sees."""
    q, k = _f64(q), _f64(k)
    k = repeat_kv_heads(k, q.shape[1]) if q.ndim == 4 else k
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return q @ np.swapaxes(k, -1, -2) * scale + attention_bias(mask, is_causal, q.shape[-2], k.shape[-2])


def attention_weights(q, k, mask=None, is_causal=False, scale=None) -> np.ndarray:
    """softmax of the scores; a fully masked row gets all-zero weights."""
    s = scores(q, k, mask, is_causal, scale)
    row_max = np.max(s, axis=-1, keepdims=True)
    fully_masked = np.isneginf(row_max)
    e = np.exp(s - np.where(fully_masked, 0.0, row_max))
    total = np.sum(e, axis=-1, keepdims=True)
    return np.where(fully_masked, 0.0, e / np.where(fully_masked, 1.0, total))


def fully_masked_rows(q, k, mask=None, is_causal=False) -> np.ndarray:
    """(B, Hq, Lq) boolean: rows in which no key may be attended."""
    lq, lk = q.shape[-2], k.shape[-2]
    bias = np.broadcast_to(attention_bias(mask, is_causal, lq, lk), q.shape[:-2] + (lq, lk))
    return np.all(np.isneginf(bias), axis=-1)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, fully_masked_rows_policy: str = "zeros") -> np.ndarray:
    """Scaled dot-product attention, (B, Hq, Lq, Dv) float64.

    ``fully_masked_rows_policy`` gives the result for rows with no attendable key:
    'zeros' (the canonical one), 'nan', or 'uniform' (the mean of v over all keys).
    """
    v = repeat_kv_heads(_f64(v), np.shape(q)[1])
    weights = attention_weights(q, k, mask, is_causal, scale)
    out = weights @ v
    empty = fully_masked_rows(q, k, mask, is_causal)[..., None]
    if fully_masked_rows_policy == "nan":
        out = np.where(empty, np.nan, out)
    elif fully_masked_rows_policy == "uniform":
        out = np.where(empty, np.mean(v, axis=-2, keepdims=True), out)
    return out


def multi_head_attention(
    query, key, value, params, num_heads, mask=None, is_causal=False, trace=None, fully_masked_rows_policy="zeros"
):
    """Projections, split into heads, sdpa per head, merge, output projection.

    If ``trace`` is a dict it receives every intermediate by name (the names
    fixtures use in ``shapes``).
    """
    trace = {} if trace is None else trace
    p = {name: _f64(value_) for name, value_ in params.items()}

    def project(x, name):
        y = _f64(x) @ p["w_" + name]
        return y + p["b_" + name] if "b_" + name in p else y

    def split(x):
        b, length, width = x.shape
        return np.swapaxes(x.reshape(b, length, num_heads, width // num_heads), 1, 2)

    trace["q_proj"], trace["k_proj"], trace["v_proj"] = project(query, "q"), project(key, "k"), project(value, "v")
    # The packed layout some documents use: per position, per head, [q_h | k_h | v_h].
    b, lq, _ = trace["q_proj"].shape
    if trace["q_proj"].shape == trace["k_proj"].shape == trace["v_proj"].shape:
        heads = [split(trace[n + "_proj"]) for n in "qkv"]
        trace["qkv_packed_permuted"] = np.concatenate(heads, axis=-1)
        trace["qkv_packed_heads"] = np.swapaxes(trace["qkv_packed_permuted"], 1, 2)
        trace["qkv_packed"] = trace["qkv_packed_heads"].reshape(b, lq, -1)
    trace["q_heads"], trace["k_heads"], trace["v_heads"] = (split(trace[n + "_proj"]) for n in "qkv")
    trace["scores"] = scores(trace["q_heads"], trace["k_heads"], mask, is_causal)
    trace["weights"] = attention_weights(trace["q_heads"], trace["k_heads"], mask, is_causal)
    trace["context"] = sdpa(
        trace["q_heads"], trace["k_heads"], trace["v_heads"], mask, is_causal,
        fully_masked_rows_policy=fully_masked_rows_policy,
    )
    trace["context_transposed"] = np.swapaxes(trace["context"], 1, 2)
    trace["merged"] = trace["context_transposed"].reshape(b, lq, -1)
    trace["output"] = project(trace["merged"], "o")
    return trace["output"]

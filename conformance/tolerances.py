"""Allowed error of an implementation against the oracle, per element, per dtype.

The model and its derivation are in spec/tolerances.yaml; this module only
evaluates it. Every function returns an array that broadcasts against the
operation's output.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from . import oracle
from .specdata import SPEC_DIR, read_yaml


@functools.lru_cache(maxsize=None)
def model() -> dict:
    return read_yaml(SPEC_DIR / "tolerances.yaml")


def unit_roundoff(dtype: str) -> float:
    return float(model()["unit_roundoff"][dtype])


def tf32_unit_roundoff() -> float:
    """Unit roundoff of a TF32 matmul input (10 explicit mantissa bits): 2^-11."""
    return float(model()["tf32"]["unit_roundoff"])


def tf32_input_constant() -> float:
    """c_in of spec/tolerances.yaml 'tf32', times the safety factor."""
    return _constants("tf32")["c_in"]


def _tf32_input_rounding(tf32: bool) -> float:
    """u_in of spec/tolerances.yaml 'tf32': the relative rounding of each matmul input, 0 unless declared."""
    return tf32_unit_roundoff() if tf32 else 0.0


def _constants(section: str) -> dict:
    m = model()
    return {k: float(v) * m["safety_factor"] for k, v in m[section].items() if k.startswith("c_")}


def softmax_allowed(x, axis: int, dtype: str) -> np.ndarray:
    c = _constants("softmax")
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[axis]
    u = unit_roundoff(dtype)
    magnitude = np.max(np.where(np.isfinite(x), np.abs(x), 0.0), axis=axis, keepdims=True)
    p = oracle.softmax(x, axis=axis)
    return u * (c["c_out"] + c["c_acc"] * math.sqrt(n)) + c["c_shift"] * u * p * magnitude


def _output_growth(lk: int) -> float:
    """How the output's rounding grows with the number of keys: c_out + c_acc * sqrt(Lk)."""
    c = _constants("sdpa")
    return c["c_out"] + c["c_acc"] * math.sqrt(lk)


def sdpa_row_bound(u: float, v_max, weighted_score_error, lk: int):
    """The allowed error of an output row that attends some key (spec/tolerances.yaml, sdpa):
    u * V_i * (c_out + c_acc * sqrt(Lk)) + 2 * c_score * V_i * sum_j p_ij * ds_ij."""
    return u * v_max * _output_growth(lk) + _constants("sdpa")["c_score"] * 2 * v_max * weighted_score_error


def uniform_row_bound(u: float, v_abs_max, lk: int):
    """The allowed error of a fully masked row under the 'uniform' policy (the mean of v over all keys)."""
    return u * v_abs_max * _output_growth(lk)


def _sdpa_terms(q, k, v, mask, is_causal, scale, u, dq=None, dk=None, dv=None, u_in: float = 0.0):
    """Allowed error per output element of sdpa, given optional absolute input errors dq, dk, dv.

    ``u_in`` is the relative rounding of each matmul input (TF32: 2^-11, else 0); it adds
    2 u_in |scale| |q_i|.|k_j| to each score error and 2 u_in V_i to each output row
    (P and v rounded before P @ V), times c_in (spec/tolerances.yaml, tf32)."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    hq = q.shape[1]
    k, v = oracle.repeat_kv_heads(k, hq), oracle.repeat_kv_heads(v, hq)
    if dk is not None:
        dk, dv = oracle.repeat_kv_heads(dk, hq), oracle.repeat_kv_heads(dv, hq)
    dk_, lk = q.shape[-1], k.shape[-2]
    scale_value = 1.0 / math.sqrt(dk_) if scale is None else float(scale)
    weights = oracle.attention_weights(q, k, mask, is_causal, scale)
    abs_scores = np.abs(q) @ np.swapaxes(np.abs(k), -1, -2) * abs(scale_value)
    bias = oracle.attention_bias(mask, is_causal, q.shape[-2], lk)
    finite_bias = np.where(np.isfinite(bias), np.abs(bias), 0.0)
    c_in = tf32_input_constant()
    score_error = u * (math.sqrt(dk_) * abs_scores + finite_bias) + c_in * 2 * u_in * abs_scores
    if dq is not None:
        score_error = score_error + abs(scale_value) * (
            dq @ np.swapaxes(np.abs(k), -1, -2) + np.abs(q) @ np.swapaxes(dk, -1, -2)
        )
    attended = weights > 0
    v_row_max = np.max(np.abs(v), axis=-1)[..., None, :]  # (B, H, 1, Lk)
    v_max = np.max(np.where(attended, v_row_max, 0.0), axis=-1, keepdims=True)
    # A fully masked row attends nothing; under the 'uniform' policy it averages all of v.
    empty = ~attended.any(axis=-1, keepdims=True)
    v_max = np.where(empty, np.max(v_row_max, axis=-1, keepdims=True), v_max)
    allowed = sdpa_row_bound(u, v_max, np.sum(weights * score_error, axis=-1, keepdims=True), lk)
    allowed = allowed + c_in * 2 * u_in * v_max
    if dv is not None:
        allowed = allowed + weights @ dv
    return allowed


def sdpa_allowed(q, k, v, mask, is_causal, scale, dtype: str, policy: str = "zeros", tf32: bool = False) -> np.ndarray:
    u = unit_roundoff(dtype)
    allowed = _sdpa_terms(q, k, v, mask, is_causal, scale, u, u_in=_tf32_input_rounding(tf32))
    empty = oracle.fully_masked_rows(q, k, mask, is_causal)[..., None]
    if policy == "uniform":
        v_all = oracle.repeat_kv_heads(np.abs(np.asarray(v, dtype=np.float64)), np.shape(q)[1])
        spread = uniform_row_bound(u, np.max(v_all, axis=(-2, -1), keepdims=True), v_all.shape[-2])
        return np.where(empty, spread, allowed)
    return np.where(empty, 0.0, allowed)


def mha_allowed(query, key, value, params, num_heads, mask, is_causal, dtype: str, tf32: bool = False) -> np.ndarray:
    u = unit_roundoff(dtype)
    u_in = _tf32_input_rounding(tf32)
    c_proj = _constants("multi_head_attention")["c_proj"]
    c_in = tf32_input_constant()
    p = {name: np.asarray(a, dtype=np.float64) for name, a in params.items()}
    trace: dict = {}
    oracle.multi_head_attention(query, key, value, p, num_heads, mask, is_causal, trace=trace)

    def projection_error(x, name):
        x = np.abs(np.asarray(x, dtype=np.float64))
        w = np.abs(p["w_" + name])
        b = np.abs(p.get("b_" + name, 0.0))
        return c_proj * u * (math.sqrt(x.shape[-1]) * (x @ w) + b) + c_in * 2 * u_in * (x @ w)

    def split(x):
        b, length, width = x.shape
        return np.swapaxes(x.reshape(b, length, num_heads, width // num_heads), 1, 2)

    dq, dk, dv = (split(projection_error(x, n)) for x, n in ((query, "q"), (key, "k"), (value, "v")))
    context_error = _sdpa_terms(
        trace["q_heads"], trace["k_heads"], trace["v_heads"], mask, is_causal, None, u, dq, dk, dv, u_in=u_in
    )
    context_error = np.broadcast_to(context_error, trace["context"].shape)
    merged_error = np.swapaxes(context_error, 1, 2).reshape(trace["merged"].shape)
    return merged_error @ np.abs(p["w_o"]) + projection_error(trace["merged"], "o")

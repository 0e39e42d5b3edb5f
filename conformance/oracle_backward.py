"""The float64 analytic backward of scaled dot-product attention, written for clarity.

With S = scale * q k^T + bias (bias from the mask and the causal flag, as in
oracle.attention_bias), P = softmax(S) along the keys (a fully masked row has
P = 0) and O = P v, the gradients of a loss L with upstream gradient dO = dL/dO are

    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - rowsum(dP * P))          (the softmax Jacobian diag(p) - p p^T)
    dQ = scale * dS K
    dK = scale * dS^T Q
    dMask = dS, summed over the axes along which the mask was broadcast

With grouped-query attention (Hq = G * Hkv) K and V are first repeated to Hq heads
(query head h uses kv head h // G), so dK and dV sum over the G query heads of the
group sharing a kv head. Every function widens its inputs to float64 (exact) and
returns float64. See spec/clauses.yaml, section "gradients".
"""
from __future__ import annotations

import math

import numpy as np

from . import oracle


def _f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def sum_kv_groups(x: np.ndarray, num_kv_heads: int) -> np.ndarray:
    """(B, Hq, ...) -> (B, Hkv, ...): sum over the Hq / Hkv query heads that share each kv head."""
    b, hq = x.shape[:2]
    return x.reshape(b, num_kv_heads, hq // num_kv_heads, *x.shape[2:]).sum(axis=2)


def reduce_to_shape(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``x`` over the axes along which an array of ``shape`` was broadcast to x.shape."""
    extra = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(extra))) if extra > 0 else x
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def is_float_mask(mask) -> bool:
    return mask is not None and np.asarray(mask).dtype != np.bool_


def sdpa_backward(q, k, v, d_out, mask=None, is_causal=False, scale=None) -> dict[str, np.ndarray]:
    """Gradients of sdpa (oracle.sdpa, policy 'zeros') for the upstream gradient ``d_out``.

    Returns {"dq", "dk", "dv"} with the shapes of q, k, v, and "dmask" with the
    mask's shape when the mask is a float (additive) one.
    """
    q, k, v, d_out = _f64(q), _f64(k), _f64(v), _f64(d_out)
    hq, hkv = q.shape[1], k.shape[1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    k_rep, v_rep = oracle.repeat_kv_heads(k, hq), oracle.repeat_kv_heads(v, hq)
    p = oracle.attention_weights(q, k, mask, is_causal, scale)  # (B, Hq, Lq, Lk); empty rows 0

    dv_rep = np.swapaxes(p, -1, -2) @ d_out                     # dV = P^T dO, per query head
    dp = d_out @ np.swapaxes(v_rep, -1, -2)                     # dP = dO V^T
    row = np.sum(dp * p, axis=-1, keepdims=True)                # rowsum(dP * P)
    ds = p * (dp - row)                                         # dS = P * (dP - rowsum)
    dq = scale * (ds @ k_rep)                                   # dQ = scale dS K
    dk_rep = scale * (np.swapaxes(ds, -1, -2) @ q)              # dK = scale dS^T Q, per query head

    grads = {
        "dq": dq,
        "dk": sum_kv_groups(dk_rep, hkv),                       # GQA: sum over the group
        "dv": sum_kv_groups(dv_rep, hkv),
    }
    if is_float_mask(mask):
        grads["dmask"] = reduce_to_shape(ds, np.shape(mask))
    return grads


def attention_parts(q, k, v, d_out, mask=None, is_causal=False, scale=None) -> dict[str, np.ndarray]:
    """The intermediates of the backward (float64, kv heads repeated to Hq), for the tolerance model."""
    q, k, v, d_out = _f64(q), _f64(k), _f64(v), _f64(d_out)
    hq = q.shape[1]
    scale_value = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    k_rep, v_rep = oracle.repeat_kv_heads(k, hq), oracle.repeat_kv_heads(v, hq)
    p = oracle.attention_weights(q, k, mask, is_causal, scale)
    dp = d_out @ np.swapaxes(v_rep, -1, -2)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    return {"q": q, "k": k_rep, "v": v_rep, "d_out": d_out, "p": p, "dp": dp, "ds": ds, "scale": scale_value}

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

The variants (spec/clauses.yaml grad.softcap, grad.variants, grad.learnable-sink; derived in
docs/gradients.md) change three things. The keys a window, an offset band, a chunk, key lengths or
a left padding remove have P = 0, and ALiBi's bias is part of S: both enter through P alone.
Softcap c makes S = c tanh(T / c) + bias of T = scale q k^T, so dQ and dK take dT = dS * G with
G = 1 - (S_cap / c)^2 (the cap's derivative); dMask stays dS. A learnable sink sigma_h is one more
column of the softmax whose value row is 0: its weight P_sink = exp(sigma_h - m) / Z takes its share
of every row, and dsigma_h = sum over b, i of dS_sink = -P_sink r, r = rowsum(dP * P) (= dO . O).
ALiBi slopes, lengths and paddings are constants, not differentiated.
"""
from __future__ import annotations

import math

import numpy as np

from attention_conformance.conformance.reference import oracle


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


def sdpa_backward(q, k, v, d_out, mask=None, is_causal=False, scale=None, **variants) -> dict[str, np.ndarray]:
    """Gradients of sdpa (oracle.sdpa, policy 'zeros') for the upstream gradient ``d_out``.

    Returns {"dq", "dk", "dv"} with the shapes of q, k, v, "dmask" with the mask's shape when the mask is a float
    (additive) one, and "dsink" (Hq,) with a learnable sink. ``variants``: the case's variant keywords
    (oracle.variant_options; query_lengths changes nothing here).
    """
    a = attention_parts(q, k, v, d_out, mask, is_causal, scale, **variants)
    hkv = np.shape(k)[1]
    ds, dt = a["ds"], a["ds"] * a["softcap_slope"]             # dT = dS * (1 - (S_cap / c)^2) under softcap
    grads = {
        "dq": a["scale"] * (dt @ a["k"]),                       # dQ = scale dT K
        "dk": sum_kv_groups(a["scale"] * (np.swapaxes(dt, -1, -2) @ a["q"]), hkv),  # dK = scale dT^T Q, GQA sum
        "dv": sum_kv_groups(np.swapaxes(a["p"], -1, -2) @ a["d_out"], hkv),        # dV = P^T dO, GQA sum
    }
    if is_float_mask(mask):
        grads["dmask"] = reduce_to_shape(ds, np.shape(mask))     # the mask is added after the cap: dS itself
    if a["p_sink"] is not None:                                 # dS of the sink's column, summed over b and i
        grads["dsink"] = -np.sum(a["p_sink"] * a["row"], axis=(0, 2, 3))
    return grads


def attention_parts(q, k, v, d_out, mask=None, is_causal=False, scale=None, **variants) -> dict[str, np.ndarray]:
    """The intermediates of the backward (float64, kv heads repeated to Hq), for sdpa_backward and the tolerance
    model: p (B, Hq, Lq, Lk) the weights (the sink in the normaliser), dp = dO V^T, row = rowsum(dp * p), ds, and
    under softcap t (the uncapped scale q k^T), capped (c tanh(t / c)) and softcap_slope (1 - (capped / c)^2; 1.0
    without softcap); p_sink (B, Hq, Lq, 1) the sink's weight and sink (1, Hq, 1, 1) its logit, None without one."""
    variants = {n: x for n, x in variants.items() if n != "query_lengths"}
    q, k, v, d_out = _f64(q), _f64(k), _f64(v), _f64(d_out)
    hq = q.shape[1]
    scale_value = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    k_rep, v_rep = oracle.repeat_kv_heads(k, hq), oracle.repeat_kv_heads(v, hq)
    p = oracle.attention_weights(q, k, mask, is_causal, scale, **variants)  # (B, Hq, Lq, Lk); empty rows 0
    dp = d_out @ np.swapaxes(v_rep, -1, -2)
    row = np.sum(dp * p, axis=-1, keepdims=True)
    parts = {"q": q, "k": k_rep, "v": v_rep, "d_out": d_out, "p": p, "dp": dp, "row": row, "ds": p * (dp - row),
             "scale": scale_value, "softcap_slope": 1.0, "p_sink": None, "sink": None}
    softcap = variants.get("softcap")
    if softcap is not None:
        parts["t"] = scale_value * (q @ np.swapaxes(k_rep, -1, -2))
        parts["capped"] = oracle.softcapped(parts["t"], softcap)
        # sech^2(t / c), not 1 - tanh^2: past |t / c| = 19 tanh rounds to 1 in float64 and 1 - tanh^2 to 0, while an
        # implementation's slope there is a tiny positive number (a float64 one-key row of a correct custom_vjp got dq
        # 7e-31 against an allowance of 1e-307); it underflows to 0 only past |t / c| = 354.
        with np.errstate(over="ignore"):
            parts["softcap_slope"] = 1.0 / np.cosh(parts["t"] / float(softcap)) ** 2
    if variants.get("learnable_sink") is not None:
        parts["sink"] = oracle.sink_logits(variants["learnable_sink"], hq)
        parts["p_sink"] = sink_weight(oracle.scores(q, k, mask, is_causal, scale, **variants), parts["sink"])
    return parts


def sink_weight(scores: np.ndarray, sink: np.ndarray) -> np.ndarray:
    """(..., Lq, 1): the learnable sink's own weight exp(sigma - m) / Z in each row of ``scores`` (-inf where a key is
    removed), m = max(sigma, max_j s_j), Z = exp(sigma - m) + sum_j exp(s_j - m); 1 in a row without keys."""
    m = np.maximum(np.max(scores, axis=-1, keepdims=True), sink)
    own = np.exp(sink - m)
    return own / (own + np.sum(np.exp(scores - m), axis=-1, keepdims=True))

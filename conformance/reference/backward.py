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


# ------------------------------------------------------------------ packed batches (grad.varlen)
def _heads_first(x: np.ndarray) -> np.ndarray:
    """(L, H, D) -> (1, H, L, D)."""
    return np.swapaxes(np.asarray(x), 0, 1)[None]


def _tokens_first(x: np.ndarray) -> np.ndarray:
    """(1, H, L, D) -> (L, H, D)."""
    return np.swapaxes(np.asarray(x)[0], 0, 1)


def varlen_backward(inputs: dict, d_out, alignment: str = "bottom-right", per_sequence=None) -> dict[str, np.ndarray]:
    """Gradients of sdpa_varlen (oracle.sdpa_varlen, policy 'zeros') for the upstream gradient ``d_out`` (total_q,
    Hq, Dv), sequence by sequence (grad.varlen): sequence b is its sdpa case of batch 1 (oracle.sequence_cases), so
    its packed rows of dq are that case's dq and its used keys' rows of dk, dv that case's dk, dv; the keys past
    seqused_k[b], and every key of a sequence without queries, take exactly 0; dsink (Hq,) sums the sequences'.

    ``inputs`` by the contract's names (q (total_q, Hq, Dk), k, v (total_k, Hkv, D), cu_seqlens_q, ...).
    ``per_sequence(one, d_out_b)``: what to compute for each sequence's sdpa case (one: oracle.sequence_cases' dict,
    d_out_b (1, Hq, Lq_b, Dv)) instead of sdpa_backward, a dict of dq, dk, dv (and dsink) of its shapes: the tolerance
    model (conformance/judging/gradients.py) assembles its allowances the same way."""
    compute = per_sequence or (lambda one, d: sdpa_backward(one["q"], one["k"], one["v"], d, None, one["is_causal"],
                                                            one["scale"], **sequence_variants(one)))
    q, k, v = (_f64(inputs[n]) for n in ("q", "k", "v"))
    d_out = _f64(d_out)
    grads = {"dq": np.zeros_like(q), "dk": np.zeros_like(k), "dv": np.zeros_like(v)}
    if inputs.get("learnable_sink") is not None:
        grads["dsink"] = np.zeros(q.shape[1])
    spans = oracle.varlen_spans(inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], inputs.get("seqused_k"))
    for one, (qs, qe, ks, ke) in zip(oracle.sequence_cases("sdpa_varlen", inputs, alignment), spans):
        if qe == qs or ke == ks:
            continue  # no rows, or rows without a key (dO 0 there): no gradient flows
        g = compute(one, _heads_first(d_out[qs:qe]))
        grads["dq"][qs:qe] = _tokens_first(g["dq"])
        grads["dk"][ks:ke] = _tokens_first(g["dk"])
        grads["dv"][ks:ke] = _tokens_first(g["dv"])
        if "dsink" in grads:
            grads["dsink"] = grads["dsink"] + g["dsink"]
    return grads


def sequence_variants(one: dict) -> dict:
    """The variant keywords of one sequence's sdpa case (oracle.sequence_cases)."""
    return {n: x for n, x in one.items() if n not in ("q", "k", "v", "mask", "is_causal", "scale")}


# ------------------------------------------------------------------ multi-head attention (grad.mha)
def merge_heads(x: np.ndarray) -> np.ndarray:
    """(B, H, L, D) -> (B, L, H * D): mha.head-merge."""
    b, h, length, width = x.shape
    return np.swapaxes(x, 1, 2).reshape(b, length, h * width)


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, L, H * D) -> (B, H, L, D): mha.head-split."""
    b, length, width = x.shape
    return np.swapaxes(x.reshape(b, length, num_heads, width // num_heads), 1, 2)


def mha_backward(query, key, value, params, num_heads, d_out, mask=None, is_causal=False, trace=None,
                 **variants) -> dict[str, np.ndarray]:
    """Gradients of multi_head_attention (oracle.multi_head_attention, policy 'zeros') for the upstream gradient
    ``d_out`` (B, Lq, E_out), by the chain rule through its pipeline (grad.mha): with Y = merged W_o + b_o,

        dW_o = sum over b, i of merged^T dY,  db_o = sum dY,  d_merged = dY W_o^T, split into the heads' dO;
        each head's sdpa backward (sdpa_backward, the variant keywords per head) gives dQ_h, dK_h, dV_h, merged
        back into dQ (B, Lq, H * Dk) ...;  d_query = dQ W_q^T,  dW_q = sum query^T dQ,  db_q = sum dQ (k, v alike).

    Returns "dquery", "dkey", "dvalue", "d" + each parameter's name ("dw_q", "db_q", ...) and "dsink" with a learnable
    sink. The mask and every other keyword are constants. ``trace``: the oracle's trace of the case, where the caller
    has it."""
    if trace is None:
        trace = {}
        oracle.multi_head_attention(query, key, value, params, num_heads, mask, is_causal, trace=trace, **variants)
    p = {name: _f64(x) for name, x in params.items()}
    dy = _f64(d_out)
    grads = {"dw_o": np.einsum("bld,ble->de", trace["merged"], dy)}
    if "b_o" in p:
        grads["db_o"] = dy.sum(axis=(0, 1))
    heads = sdpa_backward(trace["q_heads"], trace["k_heads"], trace["v_heads"], split_heads(dy @ p["w_o"].T, num_heads),
                          mask, is_causal, None, **variants)
    for name, x in (("query", query), ("key", key), ("value", value)):
        n = name[0]
        d_projected = merge_heads(heads["d" + n])  # (B, L, H * D)
        grads["d" + name] = d_projected @ p["w_" + n].T
        grads["dw_" + n] = np.einsum("ble,bld->ed", _f64(x), d_projected)
        if "b_" + n in p:
            grads["db_" + n] = d_projected.sum(axis=(0, 1))
    if "dsink" in heads:
        grads["dsink"] = heads["dsink"]
    return grads

"""Gradients of an implementation's sdpa, and the tolerance model that judges them.

``gradients(impl, inputs, d_out, device)`` differentiates the implementation's own
sdpa with its framework's autodiff, through the ``vjp`` of the implementation's
array adapter (implementations/arrays.py): for ARRAY "torch" the inputs become
leaf tensors with requires_grad and ``out.backward(d_out)`` runs; for ARRAY "jax"
``jax.vjp`` runs over a function of (q, k, v[, mask]) calling sdpa. Which kinds
differentiate at all (DIFFERENTIABLE) is what the adapters declare. Only a float
(additive) mask is differentiated; a boolean mask is a constant. 16-bit inputs are
differentiated as the framework does it, in that dtype; the results are widened to
float64 for the comparison. Frameworks are imported only inside the adapters. An
implementation declaring LAYOUT "blhd" gets q, k, v and d_out as (B, L, H, D) and
gives out, dq, dk, dv back in it; they are returned here as (B, H, L, D).

``backward_allowed`` evaluates the ``sdpa_backward`` section of spec/tolerances.yaml
(the derivation is written there) against the float64 analytic backward of
conformance/reference/backward.py.

Variant keywords (grad.softcap, grad.variants, grad.learnable-sink) reach the
implementation's sdpa as in a forward call: a learnable sink is differentiated
("dsink"), every other keyword (ALiBi slopes, lengths, paddings, the window) is a constant.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from attention_conformance.conformance.reference import backward as oracle_backward
from attention_conformance.conformance.reference import oracle
from attention_conformance.conformance.reference.tolerances import (
    model,
    moved_weight_bound,
    smallest_normal,
    tf32_unit_roundoff,
    unit_roundoff,
)
from attention_conformance.implementations.arrays import ARRAY_KINDS, differentiable_kinds

GRAD_NAMES = {"q": "dq", "k": "dk", "v": "dv", "mask": "dmask", "learnable_sink": "dsink"}


def _keywords(inputs: dict[str, Any], kind, device: str) -> dict[str, Any]:
    """The optional keywords of the call, defaults left out (as Implementation.call does); the variant keywords the
    case uses but the learnable sink (differentiated, a primal) as constants, arrays in the implementation's type."""
    kwargs = {}
    if inputs.get("is_causal", False):
        kwargs["is_causal"] = True
    if inputs.get("scale") is not None:
        kwargs["scale"] = inputs["scale"]
    for name, value in oracle.variant_options(inputs).items():
        if name != "learnable_sink":
            kwargs[name] = kind.to_native(value, device) if isinstance(value, np.ndarray) else value
    return kwargs


def gradients(impl, inputs: dict[str, Any], d_out: np.ndarray, device: str) -> dict[str, np.ndarray | None]:
    """Output and gradients of ``impl.obj.sdpa`` at ``inputs`` (rounded to the dtype) for upstream ``d_out``.

    Returns float64 NumPy arrays under "out", "dq", "dk", "dv", for a float mask
    "dmask", and for a learnable sink "dsink"; a gradient that did not reach its input is None. Raises
    NotDifferentiable when the output carries no gradient at all, and lets the
    implementation's own exceptions (NotImplementedError included) through.
    """
    kind = ARRAY_KINDS[impl.array]
    if not kind.DIFFERENTIABLE:
        raise ValueError(f"{impl.name}: gradients need an ARRAY whose adapter differentiates "
                         f"({', '.join(differentiable_kinds())}), not {impl.array!r}")
    names = _differentiated(inputs)
    # q, k, v in the implementation's LAYOUT, dq, dk, dv back in it; d_out and the output in its output layout
    # (OUTPUT_LAYOUT, else LAYOUT): each transposed to (B, H, L, D) here.
    primals = {name: kind.to_native(impl.to_layout("sdpa", name, np.asarray(inputs[name])), device) for name in names}
    constant_mask = None
    if "mask" not in names and inputs.get("mask") is not None:
        constant_mask = kind.to_native(np.asarray(inputs["mask"]), device)  # a boolean mask: a constant
    kwargs = _keywords(inputs, kind, device)

    def forward(q, k, v, mask=None, learnable_sink=None):
        mask = constant_mask if mask is None else mask
        extra = dict(kwargs, mask=mask) if mask is not None else dict(kwargs)
        if learnable_sink is not None:
            extra["learnable_sink"] = learnable_sink
        return impl.obj.sdpa(q, k, v, **extra)

    with kind.precision(inputs):  # JAX: x64 for a float64 case only (implementations/arrays.py)
        out, grads = kind.vjp(forward, primals, impl.output_to_layout("sdpa", np.asarray(d_out)), device)
    result = {"out": impl.output_from_layout("sdpa", _to_f64(kind, out))}
    for name in names:
        gradient = _to_f64(kind, grads.get(name))
        result[GRAD_NAMES[name]] = impl.from_layout("sdpa", gradient) if name in impl.layout_inputs("sdpa") \
            else gradient
    return result


def _differentiated(inputs: dict[str, Any]) -> list[str]:
    names = ["q", "k", "v"]
    if oracle_backward.is_float_mask(inputs.get("mask")):
        names.append("mask")
    if inputs.get("learnable_sink") is not None:
        names.append("learnable_sink")
    return names


def _to_f64(kind, value) -> np.ndarray | None:
    return None if value is None else np.asarray(kind.to_numpy(value)).astype(np.float64)


# ------------------------------------------------------------------ tolerance
def _constants() -> dict[str, float]:
    m = model()
    return {k: float(v) * m["safety_factor"] for k, v in m["sdpa_backward"].items() if k.startswith("c_")}


def _variant_constants(constants: dict[str, float] | None) -> dict[str, float]:
    """c_alibi and c_sink of spec/tolerances.yaml's variants section and c_tanh of its variant_gradients section as
    they enter the backward: unscaled (the sdpa_backward c_score they are multiplied by carries the safety factor),
    or the calibration's own."""
    raw = {key: float(value) for section in ("variants", "variant_gradients")
           for key, value in model()[section].items() if key.startswith("c_")}
    return raw if constants is None else {key: constants.get(key, value) for key, value in raw.items()}


def _softcap_ds_magnitude(p, dp, abs_ds, ds_err, p_sink, attended) -> np.ndarray:
    """|dS_ij| for softcap's term |dS| dG (spec/tolerances.yaml, sdpa_backward, softcap): the oracle's, except where
    its float64 dS_ij = P_ij (dP_ij - r_i) cancels to nothing. That happens at a row's leading key (P_ij = 1 - tiny,
    r_i = dP_ij to float64), whose exact dS_ij = P_ij sum_(l != j) P_il (dP_ij - dP_il) is tiny yet, multiplied by a
    G whose absolute error is ~u (tanh saturated there), gives a dT error the model must allow. There the bound
    P_ij (1 - P_ij) (max_l dP_il - min_l dP_il) holds (1 - P_ij summed over the other keys and the sink, whose dP is
    0), capped by the oracle's |dS| plus the implementation's allowed dS error, so that it only fills a cancellation."""
    weights = p if p_sink is None else np.concatenate([p, p_sink], axis=-1)
    dps = dp if p_sink is None else np.concatenate([dp, np.zeros_like(p_sink)], axis=-1)
    kept = weights > 0
    top = np.argmax(weights, axis=-1)[..., None]
    leading = np.arange(weights.shape[-1]) == top
    others = np.sum(np.where(leading, 0.0, weights), axis=-1, keepdims=True)  # 1 - P of the leading key, no cancelling
    rest = np.where(leading, others, 1.0 - weights)  # other keys: P <= 1/2, so 1 - P is exact enough
    spread = (np.max(np.where(kept, dps, -np.inf), axis=-1, keepdims=True)
              - np.min(np.where(kept, dps, np.inf), axis=-1, keepdims=True))
    bound = (weights * rest * np.where(np.isfinite(spread), spread, 0.0))[..., :p.shape[-1]]
    return np.where(attended, np.maximum(abs_ds, np.minimum(bound, abs_ds + ds_err)), abs_ds)


def backward_allowed(q, k, v, d_out, mask, is_causal, scale, dtype: str, constants: dict[str, float] | None = None,
                     tf32: bool = False, input_errors: dict | None = None, **variants) -> dict[str, np.ndarray]:
    """Allowed absolute error per element of dq, dk, dv (and dmask for a float mask, dsink for a learnable sink).

    ``constants`` overrides the spec's (already multiplied by the safety factor);
    the calibration passes all ones to measure raw ratios. ``tf32``: float32 matmuls
    declared to run in TF32 (FLOAT32_MATMUL); the backward then uses TF32's unit
    roundoff throughout (spec/tolerances.yaml, tf32). ``variants``: the case's variant keywords
    (spec/tolerances.yaml, sdpa_backward, variants: softcap's and ALiBi's roundings join the score error,
    softcap's derivative its own term, the learnable sink is one more column of the weights). ``input_errors``: what
    the implementation's own q, k, v and dO may be off by (absolute, broadcastable to q, k, v, d_out; "q", "k", "v",
    "d_out", each optional): multi-head attention's projections (spec/tolerances.yaml, mha_backward). Without them the
    allowance is the plain model's, bit for bit.
    """
    c = _constants() if constants is None else constants
    cv = _variant_constants(constants)
    u = max(unit_roundoff(dtype), tf32_unit_roundoff()) if tf32 else unit_roundoff(dtype)
    eta = smallest_normal(dtype)  # absolute error of one rounding near 0
    variants = {n: x for n, x in variants.items() if n != "query_lengths"}
    a = oracle_backward.attention_parts(q, k, v, d_out, mask, is_causal, scale, **variants)
    q64, k_rep, v_rep, d_o, p, dp, ds, sc = (a[n] for n in ("q", "k", "v", "d_out", "p", "dp", "ds", "scale"))
    hq, hkv = q64.shape[1], np.shape(k)[1]
    group = hq // hkv
    lq, lk, dk_, dv_ = q64.shape[-2], k_rep.shape[-2], q64.shape[-1], v_rep.shape[-1]
    abs_sc = abs(sc)
    # A key counts where its score is finite, not only where its float64 weight is > 0: a weight that underflows
    # to 0 (a score 745 below the row's top) can become the largest once the scores are rounded (a 16-bit score
    # offset by a float mask of -1e9 has a spacing of 4e6 there).
    raw_scores = oracle.scores(q64, k_rep, mask, is_causal, scale, **variants)
    attended = np.isfinite(raw_scores)
    given = {} if input_errors is None else {n: x for n, x in input_errors.items() if x is not None}
    err_q = np.broadcast_to(given["q"], q64.shape) if "q" in given else None
    err_k = oracle.repeat_kv_heads(np.broadcast_to(given["k"], np.shape(k)), hq) if "k" in given else None
    err_v = oracle.repeat_kv_heads(np.broadcast_to(given["v"], np.shape(v)), hq) if "v" in given else None
    err_do = np.broadcast_to(given["d_out"], d_o.shape) if "d_out" in given else None

    def t(x):
        return np.swapaxes(x, -1, -2)

    def rounding(n):  # relative error of an accumulation of n products and a final rounding
        return u * (c["c_acc"] * math.sqrt(n) + c["c_out"])

    # 1. scores: the forward model's score error (inner product, scaling, mask addition)
    bias = oracle.attention_bias(mask, is_causal, lq, lk, **oracle.key_options(variants))
    finite_bias = np.where(np.isfinite(bias), np.abs(bias), 0.0)
    # (an underflow of q * scale or k * scale, eta per element, moves a score by eta * sum |k| or sum |q|)
    underflow = eta * (1.0 + np.sum(np.abs(q64), axis=-1)[..., :, None] + np.sum(np.abs(k_rep), axis=-1)[..., None, :])
    # (and the softmax's own shift s - max(s) is rounded: u * |s_ij - m_i|, m_i the row's maximum, the sink's
    # logit included)
    s = np.where(attended, raw_scores, 0.0)
    top = np.max(np.where(attended, s, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
    sink = a["sink"]
    if sink is not None:
        top = np.maximum(top, sink)
    shift = np.where(attended, np.abs(s - top), 0.0)
    # (softcap: t / c rounded moves s by at most u |t|, tanh's own error c_tanh u |y| by c_tanh u |s|, the product by
    # c u |s|; ALiBi: slope * distance rounded and added, u |bias|)
    extra = 0.0
    if variants.get("softcap") is not None:
        extra = extra + np.abs(a["t"]) + (cv["c_tanh"] + 1.0) * np.abs(a["capped"])
    if variants.get("alibi_slopes") is not None:
        extra = extra + cv["c_alibi"] * np.abs(oracle.alibi_bias(variants["alibi_slopes"], lq, lk,
                                                                 variants.get("query_offset", 0)))
    score_err = c["c_score"] * (u * (math.sqrt(dk_) * abs_sc * (np.abs(q64) @ t(np.abs(k_rep))) + finite_bias + shift
                                     + extra) + underflow)
    if err_q is not None or err_k is not None:  # the inputs' own errors move each score (first order)
        score_err = score_err + abs_sc * ((0.0 if err_q is None else err_q @ t(np.abs(k_rep)))
                                          + (0.0 if err_k is None else np.abs(q64) @ t(err_k)))
    a_abs = np.abs(d_o) @ t(np.abs(v_rep))                        # |dO| |V|^T >= |dP|
    # ... and each dP_ij = dO_i . v_j
    input_dp = (0.0 if err_do is None else err_do @ t(np.abs(v_rep))) + (0.0 if err_v is None else
                                                                        np.abs(d_o) @ t(err_v))
    centred = np.abs(dp - a["row"])
    keys = lk
    if sink is not None:
        # The sink is one more column of the weights, of value 0 (dP = A = 0 there): its logit rounded and shifted,
        # c_sink u (|sigma| + |sigma - m|); every bound below then holds for it as for a key.
        column = np.broadcast_to(sink, p.shape[:-1] + (1,))
        sink_err = c["c_score"] * cv["c_sink"] * u * (np.abs(column) + np.abs(column - top))
        p = np.concatenate([p, a["p_sink"]], axis=-1)
        s = np.concatenate([s, column], axis=-1)
        attended = np.concatenate([attended, np.ones(column.shape, dtype=bool)], axis=-1)
        score_err = np.concatenate([np.broadcast_to(score_err, p.shape[:-1] + (lk,)), sink_err], axis=-1)
        a_abs = np.concatenate([a_abs, np.zeros(p.shape[:-1] + (1,))], axis=-1)
        centred = np.concatenate([centred, np.abs(np.broadcast_to(a["row"], p.shape[:-1] + (1,)))], axis=-1)
        keys = lk + 1
    # 2. weights: |dP_ij| <= P_ij (exp(D_ij + log sum_l P_il exp(D_il)) - 1), exact for |ds| <= D,
    #    plus the rounding of exp and of the normalising sum over Lk keys; never more than 1. In log space
    #    (log P_ij from the scores), so that a weight underflowed to 0 whose score may move by more than its gap to
    #    the row's top keeps its bound.
    d = np.where(attended, score_err, 0.0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        shifted = np.where(attended, s - np.where(np.isfinite(top), top, 0.0), -np.inf)  # top: the sink's included
        log_p = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
        moved = np.where(attended, log_p + d, -np.inf)
        moved_top = np.max(moved, axis=-1, keepdims=True)
        row_d = np.maximum(np.where(np.isfinite(moved_top), moved_top + np.log(np.sum(
            np.exp(moved - np.where(np.isfinite(moved_top), moved_top, 0.0)), axis=-1, keepdims=True)), 0.0), 0.0)
    weight_err = np.minimum(1.0, moved_weight_bound(p, log_p, d + row_d, attended, rounding(keys))
                            + c["c_out"] * eta * attended)
    # 3. dP = dO V^T and the row term rowsum(dP * P) (= rowsum(dO * O))
    dp_err = c["c_acc"] * u * math.sqrt(dv_) * a_abs + c["c_out"] * eta
    if sink is not None and not np.isscalar(input_dp):  # the sink's column has no value: no input error there
        input_dp = np.concatenate([input_dp, np.zeros(p.shape[:-1] + (1,))], axis=-1)
    dp_err = dp_err + input_dp
    row_err = np.sum(weight_err * a_abs + p * dp_err, axis=-1, keepdims=True) + \
        rounding(keys) * np.sum(p * a_abs, axis=-1, keepdims=True)
    # 4. dS = P * (dP - row)
    ds_err = (weight_err + p) * (dp_err + row_err) + (weight_err + c["c_out"] * u * p) * centred \
        + c["c_out"] * eta * attended
    if sink is not None:  # the sink's column of dS: dsigma sums it over b and i
        sink_ds_err, ds_err = ds_err[..., lk:], ds_err[..., :lk]
        weight_err, p, attended, score_err = weight_err[..., :lk], p[..., :lk], attended[..., :lk], score_err[..., :lk]
    abs_ds = np.abs(ds)
    final = c["c_out"] * eta  # the result's own underflow
    # scale * dS may underflow (eta per element) before the product with K or Q
    scaled_ds_underflow = c["c_out"] * eta * attended
    # 5. softcap: dT = dS * G, G = 1 - y^2, y = tanh(t / c). y carries the score's error through tanh' = G, the
    #    rounding of t / c and tanh's own error c_tanh u |y|; G the rounding of y^2 and of the difference:
    #    |dG| <= 2 |y| |dy| + u; the products of an autodiff chain dS * c * G / c three roundings of dT.
    dt_err, abs_dt = ds_err, abs_ds
    if variants.get("softcap") is not None:
        cap, g = abs(float(variants["softcap"])), a["softcap_slope"]
        y = np.abs(a["capped"]) / cap
        dy = g * (score_err + u * np.abs(a["t"])) / cap + cv["c_tanh"] * u * y
        dg = c["c_out"] * (2.0 * y * dy + u)
        ds_true = _softcap_ds_magnitude(p, dp, abs_ds, ds_err, a["p_sink"], attended)
        dt_err = ds_err * g + ds_true * dg + 3.0 * c["c_out"] * u * ds_true * g
        abs_dt = ds_true * g

    allowed = {
        # dQ = scale dT K (dT = dS without softcap)
        "dq": abs_sc * (dt_err @ np.abs(k_rep) + rounding(lk) * (abs_dt @ np.abs(k_rep)))
        + scaled_ds_underflow @ np.abs(k_rep) + final,
        # dK = scale dT^T Q, then summed over the group (one sum of group * Lq products)
        "dk": oracle_backward.sum_kv_groups(abs_sc * (t(dt_err) @ np.abs(q64)), hkv)
        + rounding(group * lq) * oracle_backward.sum_kv_groups(abs_sc * (t(abs_dt) @ np.abs(q64)), hkv)
        + oracle_backward.sum_kv_groups(t(scaled_ds_underflow) @ np.abs(q64), hkv) + final,
        # dV = P^T dO, then summed over the group
        "dv": oracle_backward.sum_kv_groups(t(weight_err) @ np.abs(d_o), hkv)
        + rounding(group * lq) * oracle_backward.sum_kv_groups(t(p) @ np.abs(d_o), hkv) + final,
    }
    if err_k is not None:  # dQ = scale dT K and dK = scale dT^T Q with the other factor's own error
        allowed["dq"] = allowed["dq"] + abs_sc * (abs_dt @ err_k)
    if err_q is not None:
        allowed["dk"] = allowed["dk"] + oracle_backward.sum_kv_groups(abs_sc * (t(abs_dt) @ err_q), hkv)
    if err_do is not None:  # dV = P^T dO with dO's own error
        allowed["dv"] = allowed["dv"] + oracle_backward.sum_kv_groups(t(p + weight_err) @ err_do, hkv)
    if oracle_backward.is_float_mask(mask):
        shape = np.shape(mask)
        summed = max(1, ds.size // max(1, int(np.prod(shape))))
        allowed["dmask"] = oracle_backward.reduce_to_shape(ds_err, shape) + rounding(summed) * \
            oracle_backward.reduce_to_shape(abs_ds, shape) + final
    if sink is not None:
        # dsigma_h = sum over b, i of the sink column's dS = -P_sink r: B * Lq terms
        sink_ds = np.abs(a["p_sink"] * a["row"])
        allowed["dsink"] = np.sum(sink_ds_err, axis=(0, 2, 3)) + rounding(p.shape[0] * lq) * \
            np.sum(sink_ds, axis=(0, 2, 3)) + final
    return allowed

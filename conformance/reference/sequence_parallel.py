"""The oracle of sdpa_sequence_parallel and its tolerance: the single-device float64 sdpa of the gathered sequence
(oracle.attention of the global q, k, v at global positions), its log-sum-exp and its gradients, and what merging
the N shards' partial states adds to each allowed error (spec/tolerances.yaml, section sequence_parallel).

Every case of the operation has Lq = Lk = L at positions 0 .. L - 1 (the layout only says which device holds
which; implementations/sequence_parallel.py), the causal flag, a window, a scale and a learnable sink as sdpa's.
"""
from __future__ import annotations

import math

import numpy as np

from attention_conformance.conformance.reference import backward as oracle_backward
from attention_conformance.conformance.reference import oracle
from attention_conformance.conformance.reference.tolerances import attention_allowed, model, unit_roundoff

OPTION_NAMES = ("is_causal", "scale", "window", "learnable_sink")


def options(inputs: dict) -> dict:
    """The sdpa keywords of a case's inputs that are not their default."""
    found = {}
    if inputs.get("is_causal"):
        found["is_causal"] = True
    for name in ("scale", "window", "learnable_sink"):
        if inputs.get(name) is not None:
            found[name] = inputs[name]
    return found


def attention(inputs: dict) -> oracle.Attention:
    """The oracle's Attention of the gathered sequence (inputs widened to float64 by the caller or here)."""
    return oracle.attention(inputs["q"], inputs["k"], inputs["v"], **options(inputs))


def gradients(inputs: dict) -> dict[str, np.ndarray]:
    """dq, dk, dv (and dsink) of sum(out * d_out) + sum(lse * d_lse) (d_lse absent: 0): the analytic backward of
    conformance/reference/backward.py for d_out, plus the lse's own term, d lse_i / d s_ij = P_ij, which adds
    P * d_lse to dS (and P_sink * d_lse to the sink's column)."""
    found = oracle_backward.sdpa_backward(inputs["q"], inputs["k"], inputs["v"], inputs["d_out"], **options(inputs))
    d_lse = inputs.get("d_lse")
    if d_lse is None:
        return found
    parts = _parts(inputs)
    lse_ds = parts["p"] * np.asarray(d_lse, np.float64)[..., None]
    kv_heads = np.shape(inputs["k"])[1]
    found["dq"] = found["dq"] + parts["scale"] * (lse_ds @ parts["k"])
    found["dk"] = found["dk"] + oracle_backward.sum_kv_groups(parts["scale"] * (np.swapaxes(lse_ds, -1, -2)
                                                                                 @ parts["q"]), kv_heads)
    if parts["p_sink"] is not None:
        found["dsink"] = found["dsink"] + np.sum(parts["p_sink"][..., 0] * d_lse, axis=(0, 2))
    return found


def _parts(inputs: dict) -> dict:
    return oracle_backward.attention_parts(inputs["q"], inputs["k"], inputs["v"], inputs["d_out"], **options(inputs))


# ------------------------------------------------------------------ tolerance
def constants() -> dict[str, float]:
    """spec/tolerances.yaml, sequence_parallel: its c_ constants times the model's safety factor."""
    m = model()
    return {k: float(v) * m["safety_factor"] for k, v in m["sequence_parallel"].items() if k.startswith("c_")}


def accumulator_roundoff(dtype: str) -> float:
    """The roundoff of the partial states between merges: float64's in float64 cases, float32's otherwise."""
    return unit_roundoff("float64" if dtype == "float64" else "float32")


def merges(inputs: dict) -> int:
    """How many partial states a ring merges into each row: one per device, and the learnable sink's start."""
    return int(inputs["world_size"]) + (inputs.get("learnable_sink") is not None)


def row_magnitude(att: oracle.Attention, lse: np.ndarray) -> np.ndarray:
    """(B, Hq, L, 1): 1 + the largest of |lse_i| and the row's attended |s_ij| (and |sigma_h|): the size of the
    numbers a merge adds and exponentiates, whose rounding moves a partial lse by u times it."""
    s = np.where(np.isfinite(att.scores), np.abs(att.scores), 0.0)
    size = np.max(s, axis=-1, keepdims=True, initial=0.0)
    if att.sink is not None:
        size = np.maximum(size, np.abs(att.sink))
    return 1.0 + np.maximum(size, np.where(np.isfinite(lse), np.abs(lse), 0.0)[..., None])


def ring_term(att: oracle.Attention, inputs: dict, dtype: str, lse: np.ndarray) -> np.ndarray:
    """(B, Hq, L, 1): c_ring M u_acc (1 + |s|): the relative error that M merges of partial states add, each moving
    the running lse by u_acc times the row's magnitude and the weights exp(lse_p - lse) by as much."""
    return constants()["c_ring"] * merges(inputs) * accumulator_roundoff(dtype) * row_magnitude(att, lse)


def value_size(att: oracle.Attention) -> np.ndarray:
    """(B, Hq, L, 1): the largest |v_jd| over the keys row i attends (every partial output is a convex combination
    of them, so a weight's relative error moves the output by at most that much)."""
    attended = (att.weights > 0)[..., None]
    return np.max(np.where(attended, np.abs(att.v)[..., None, :, :], 0.0), axis=(-2, -1), initial=0.0)[..., None]


def output_allowed(att: oracle.Attention, inputs: dict, dtype: str, lse: np.ndarray) -> np.ndarray:
    """(B, Hq, L, Dv): sdpa's allowed error (conformance/reference/tolerances.py) plus the merges' term times the
    row's largest |v|."""
    return attention_allowed(att, dtype) + ring_term(att, inputs, dtype, lse) * value_size(att)


def score_errors(att: oracle.Attention, dtype: str) -> np.ndarray:
    """(B, Hq, L, L): the first-order error of each score (sdpa's model: the inner product's
    u sqrt(Dk) |scale| sum_d |q_id k_jd|) and of its shift s_ij - m_i, u |s_ij - m_i|; 0 where a key is removed."""
    u = unit_roundoff(dtype)
    dk = att.q.shape[-1]
    attended = np.isfinite(att.scores)
    top = np.max(np.where(attended, att.scores, -np.inf), axis=-1, keepdims=True)
    shift = np.where(attended, np.abs(att.scores - np.where(np.isfinite(top), top, 0.0)), 0.0)
    product = math.sqrt(dk) * abs(att.scale) * (np.abs(att.q) @ np.swapaxes(np.abs(att.k), -1, -2))
    return np.where(attended, u * (product + shift), 0.0)


def lse_allowed(att: oracle.Attention, inputs: dict, dtype: str, lse: np.ndarray) -> np.ndarray:
    """(B, Hq, L): the allowed error of each row's lse in log space (spec/tolerances.yaml, sequence_parallel): the
    scores' errors moved through the log-sum-exp, sum_j P_ij delta_ij; the sum of the exponentials, u_acc sqrt(n)
    for n terms; the lse rounded in the accumulator and to float32, (u_acc + u_32) |lse|; and the merges' term. A
    row without anything in its denominator is exactly -inf (0 allowed)."""
    c = constants()
    u_acc, u_32 = accumulator_roundoff(dtype), unit_roundoff("float32")
    terms = np.sum(att.weights > 0, axis=-1) + (att.sink is not None)
    weighted = np.sum(att.weights * score_errors(att, dtype), axis=-1)
    size = np.where(np.isfinite(lse), np.abs(lse), 0.0)
    allowed = (c["c_lse_score"] * weighted + c["c_lse_acc"] * u_acc * np.sqrt(terms)
               + c["c_lse_out"] * (u_acc + u_32) * size + ring_term(att, inputs, dtype, lse)[..., 0])
    return np.where(np.isfinite(lse), allowed, 0.0)


def gradient_terms(inputs: dict, dtype: str, att: oracle.Attention, lse: np.ndarray) -> dict[str, np.ndarray]:
    """What a sequence-parallel backward adds to sdpa_backward's allowance (conformance/judging/gradients.py
    backward_allowed, of d_out alone), per gradient:

    - the lse's cotangent: dS gains P * d_lse, whose weights err by E_ij = P_ij (delta_ij + sum_l P_il delta_il +
      u_acc (sqrt(n) + 2)) (delta the score errors), carried to dq and dk as dS is (|scale| E |d_lse| |K|, ...) and to
      dsink through the sink's weight;
    - the merges: a backward recomputes P = exp(s - lse) from the forward's lse, off by the merges' term, and sums
      each gradient over the N devices' blocks: c_ring M u_acc (1 + |s|) times the gradient's magnitude computed in
      absolute values (|scale| |dS| |K| for dq, ...), the row magnitude taken at its largest over the case."""
    c = constants()
    u_acc = accumulator_roundoff(dtype)
    parts = _parts(inputs)
    p, scale, k_rep, q64, d_out = parts["p"], abs(parts["scale"]), parts["k"], parts["q"], parts["d_out"]
    kv_heads = np.shape(inputs["k"])[1]
    d_lse = np.zeros(lse.shape) if inputs.get("d_lse") is None else np.asarray(inputs["d_lse"], np.float64)
    delta = score_errors(att, dtype)
    terms = np.sum(p > 0, axis=-1, keepdims=True) + (parts["p_sink"] is not None)
    row_error = np.sum(p * delta, axis=-1, keepdims=True) + u_acc * (np.sqrt(terms) + 2.0)
    weight_error = c["c_lse_cotangent"] * p * (delta + row_error)
    lse_ds_error = weight_error * np.abs(d_lse)[..., None]

    def t(x):
        return np.swapaxes(x, -1, -2)

    centred = parts["dp"] - parts["row"] + d_lse[..., None]
    abs_ds = np.abs(p * centred)
    ring = constants()["c_ring"] * merges(inputs) * u_acc * float(np.max(row_magnitude(att, lse)))
    found = {
        "dq": scale * (lse_ds_error @ np.abs(k_rep)) + ring * scale * (abs_ds @ np.abs(k_rep)),
        "dk": oracle_backward.sum_kv_groups(scale * (t(lse_ds_error) @ np.abs(q64))
                                            + ring * scale * (t(abs_ds) @ np.abs(q64)), kv_heads),
        "dv": oracle_backward.sum_kv_groups(ring * (t(p) @ np.abs(d_out)), kv_heads),
    }
    if parts["p_sink"] is not None:
        sink_weight = parts["p_sink"][..., 0]
        sink_error = c["c_lse_cotangent"] * sink_weight * row_error[..., 0]
        found["dsink"] = np.sum(sink_error * np.abs(d_lse)
                                + ring * sink_weight * np.abs(parts["row"][..., 0] - d_lse), axis=(0, 2))
    return found

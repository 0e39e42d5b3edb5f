"""Allowed error of an implementation against the oracle, per element, per dtype.

The model and its derivation are in spec/tolerances.yaml; this module only
evaluates it. Every function returns an array that broadcasts against the
operation's output.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from attention_conformance.conformance.reference import oracle
from attention_conformance.conformance.specdata import SPEC_DIR, read_yaml
from attention_conformance.implementations.arrays import is_eight_bit


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


# spec/tolerances.yaml, tf32: a TF32-declared float32 sdpa is held to the sixteen_bit model of this dtype, whose unit
# roundoff TF32 shares.
TF32_MODEL_DTYPE = "float16"


def _constants(section: str) -> dict:
    m = model()
    return {k: float(v) * m["safety_factor"] for k, v in m[section].items() if k.startswith("c_")}


def softmax_allowed(x, axis: int, dtype: str, p: np.ndarray | None = None) -> np.ndarray:
    """spec/tolerances.yaml, softmax: each element's error relative to its p_j (the exponent's rounding |x_j - m|,
    the normaliser's sum and its terms' exponents, the output's rounding, a shift other than the maximum), and the
    output dtype's absolute rounding near 0. ``p``: the oracle's softmax of ``x`` where the caller has it."""
    c = _constants("softmax")
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[axis]
    u = unit_roundoff(dtype)
    finite = np.isfinite(x)
    magnitude = np.max(np.where(finite, np.abs(x), 0.0), axis=axis, keepdims=True)
    top = np.max(np.where(finite, x, -np.inf), axis=axis, keepdims=True)
    shift = np.where(finite, np.abs(x - np.where(np.isfinite(top), top, 0.0)), 0.0)  # |x_j - m|
    with np.errstate(invalid="ignore"):
        p = np.nan_to_num(oracle.softmax(x, axis=axis) if p is None else p)  # a slice without a finite entry: no p
    spread = np.sum(p * shift, axis=axis, keepdims=True)  # sum_l p_l |x_l - m|
    # The normaliser's sum in the accumulator: float32 for the 16-bit dtypes (section sixteen_bit), else the dtype's.
    u_acc = _accumulator_roundoff() if is_sixteen_bit(dtype) else u
    rounding = u * (c["c_out"] + c["c_exp"] * (shift + spread) + c["c_shift"] * magnitude)
    return p * (rounding + c["c_acc"] * u_acc * math.sqrt(n)) + c["c_out"] * _near_zero(dtype)


def smallest_normal(dtype: str) -> float:
    """The dtype's smallest positive normal number (spec/tolerances.yaml, sdpa_backward: underflow)."""
    return float(model()["sdpa_backward"]["underflow"][dtype])


def _near_zero(dtype: str) -> float:
    """spec/tolerances.yaml, softmax: eta_out, the absolute rounding of a result near 0 in the output dtype."""
    eta = smallest_normal(dtype) * (unit_roundoff(dtype) if is_sixteen_bit(dtype) else 1.0)
    return eta if dtype == "float64" else max(eta, smallest_normal("float32"))


def _output_growth(growth) -> float | np.ndarray:
    """How the output's rounding grows with the number of keys: c_out + c_acc * growth, growth sqrt(Lk) or, where
    the summands coincide, Lk (``accumulation_growth``)."""
    c = _constants("sdpa")
    return c["c_out"] + c["c_acc"] * growth


def sdpa_row_bound(u: float, v_max, weighted_score_error, growth):
    """The allowed error of an output row that attends some key (spec/tolerances.yaml, sdpa):
    u * V_i * (c_out + c_acc * growth) + 2 * c_score * V_i * sum_j p_ij * ds_ij, growth from
    ``accumulation_growth`` (sqrt(Lk), or Lk per output element whose summands coincide)."""
    return u * v_max * _output_growth(growth) + _constants("sdpa")["c_score"] * 2 * v_max * weighted_score_error


def uniform_row_bound(u: float, v, hq: int):
    """The allowed error of a fully masked row under the 'uniform' policy, the mean of v (B, Hkv, Lk, Dv) over all
    keys, for each of the hq query heads: (B, hq, 1, Dv), the growth Lk where a feature's summands coincide."""
    v = np.asarray(v, dtype=np.float64)
    v_abs_max = oracle.repeat_kv_heads(np.max(np.abs(v), axis=(-2, -1), keepdims=True), hq)
    weights = np.ones((v.shape[0], hq, 1, v.shape[-2]))
    return u * v_abs_max * _output_growth(accumulation_growth(weights, v, v.shape[-2], u))


def coinciding_spread() -> float:
    """spec/tolerances.yaml, sdpa: coinciding_spread (a threshold: no safety factor). Replaced by -1 (no spread is
    that small), it gives the model before the rule, as benchmarks/coinciding_summands.py compares."""
    return float(model()["sdpa"]["coinciding_spread"])


# Elements (rows x keys x features) gathered at a time where a row's attended keys must be read feature by feature.
_GATHER_ELEMENTS = 1 << 22


def accumulation_growth(weights: np.ndarray, v: np.ndarray, terms: int, u: float,
                        weights_rounding: float = 0.0) -> float | np.ndarray:
    """How the rounding of the sum o_id = sum_j p_ij v_jd grows with the number of its terms (spec/tolerances.yaml,
    sdpa, coinciding summands): sqrt(terms) for independent roundings, ``terms`` for an output element whose
    summands agree to within coinciding_spread * terms * u, relative (they round alike).

    weights (B, Hq, n, K) float64, 0 on keys a row does not attend; v (B or 1, Hkv, K, Dv), Hkv dividing Hq (query
    head h reads kv head h // (Hq / Hkv)). ``weights_rounding``: the unit roundoff of the dtype the weights are
    rounded to before the sum (16-bit paths), under which a row's weights within 2 u of each other count as equal.
    Returns sqrt(terms) (a float) where no element's summands coincide, else
    (B, Hq, n, Dv). Only rows with flat weights are read further, and of those only the features that two
    attended keys (the first and the last) do not already prove spread.
    """
    independent = math.sqrt(terms)
    limit = coinciding_spread() * terms * u
    attended = weights > 0
    top = np.max(weights, axis=-1)
    low = np.min(np.where(attended, weights, np.inf), axis=-1)
    with np.errstate(invalid="ignore"):
        weight_spread = np.where(top > 0, (top - low) / np.where(top > 0, top, 1.0), np.inf)  # (B, Hq, n)
    weight_spread = np.where(weight_spread <= 2.0 * weights_rounding, 0.0, weight_spread)
    flat = weight_spread <= limit
    if not flat.any():
        return independent
    b, h, i = np.nonzero(flat)
    group = weights.shape[1] // v.shape[1]
    vb = b if v.shape[0] > 1 else np.zeros_like(b)
    rows_attended = attended[b, h, i]  # (F, K)
    first = np.argmax(rows_attended, axis=-1)
    last = rows_attended.shape[-1] - 1 - np.argmax(rows_attended[:, ::-1], axis=-1)
    kv = h // group
    v_first, v_last = v[vb, kv, first], v[vb, kv, last]  # (F, Dv)
    budget = limit - weight_spread[b, h, i][:, None]  # what the values' relative spread may use
    head_all = np.abs(v).max(axis=-2)[vb, kv]  # (F, Dv): >= the largest |v_jd| of any key subset
    spread_all = (v.max(axis=-2) - v.min(axis=-2))[vb, kv]  # >= the spread over any key subset
    ends = np.maximum(np.abs(v_first), np.abs(v_last))  # <= the largest |v_jd| over the attended keys
    # Two attended keys farther apart than the budget: spread (not coinciding); the spread over every key within
    # it: coinciding. A feature where both ends are 0 and the whole column is not has its spread read below.
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = np.abs(v_first - v_last) > budget * head_all
        coinciding = (spread_all <= budget * ends) & ~spread
    undecided = ~spread & ~coinciding
    step = max(1, _GATHER_ELEMENTS // (v.shape[-2] * v.shape[-1]))
    for start in range(0, len(b), step):
        rows = np.arange(start, min(len(b), start + step))
        rows = rows[undecided[rows].any(axis=-1)]
        if not len(rows):
            continue
        keys = rows_attended[rows][..., None]  # (r, K, 1)
        values = v[vb[rows], kv[rows]]  # (r, K, Dv)
        high = np.max(np.where(keys, values, -np.inf), axis=-2)
        lowest = np.min(np.where(keys, values, np.inf), axis=-2)
        largest = np.maximum(np.abs(high), np.abs(lowest))
        exact = (high - lowest) <= budget[rows] * largest
        coinciding[rows] = np.where(undecided[rows], exact, coinciding[rows])
    growth = np.full(weights.shape[:-1] + (v.shape[-1],), independent)
    growth[b, h, i] = np.where(coinciding, float(terms), independent)
    return growth


def _per_query_head(att: oracle.Attention, error):
    """An input error of k or v (B, Hkv, Lk, D) with its kv heads repeated to the Attention's Hq (GQA)."""
    return None if error is None else oracle.repeat_kv_heads(error, att.q.shape[1])


def _variant_score_error(att: oracle.Attention, u: float, sixteen_bit: bool = False) -> np.ndarray | float:
    """The extra rounding error per score of the score-changing variants (spec/tolerances.yaml, variants).

    softcap: s / cap, tanh and cap * t each rounded (c_softcap u (|s| + |cap tanh(s / cap)|)); the
    derivative of cap tanh(x / cap) is at most 1, so the errors of s itself pass through ungrown.
    ALiBi: slope * |p_i - j| rounded and added (c_alibi u |bias|). Windows, lengths and the offset
    only choose keys: no rounding of their own. (B, Hq, Lq, Lk), or 0.0 when neither is used.
    """
    softcap = att.variants.get("softcap")
    if softcap is None and att.alibi is None:
        return 0.0
    c = _variant_constants(sixteen_bit)
    extra = 0.0
    if softcap is not None:
        extra = extra + c["c_softcap"] * u * (np.abs(att.raw) + np.abs(att.capped))
    if att.alibi is not None:
        extra = extra + c["c_alibi"] * u * np.abs(att.alibi)
    return extra


def _variant_constants(sixteen_bit: bool = False) -> dict:
    """The c_ of spec/tolerances.yaml 'variants', times the safety factor of the model they enter."""
    factor = float(model()["sixteen_bit"]["safety_factor"] if sixteen_bit else model()["safety_factor"])
    return {key: float(value) * factor for key, value in model()["variants"].items() if key.startswith("c_")}


def _sink_shift(scores_: np.ndarray, sink: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m_i, m_i - max_l s_il): the row maximum with the sink logit (spec/tolerances.yaml, variants, sinks) and
    how far it lies above the row's largest score (0 unless the sink is the maximum; the sink alone where the row
    has no key)."""
    finite = np.isfinite(scores_)
    top = np.max(np.where(finite, scores_, -np.inf), axis=-1, keepdims=True)
    m = np.maximum(top, sink)
    return m, np.where(np.isfinite(top), m - top, 0.0)


def _first_order_score_errors(att: oracle.Attention, u: float, dq=None, dk=None, u_in: float = 0.0):
    """What each score of the first-order model may be off by (spec/tolerances.yaml, sdpa): u (sqrt(Dk) |scale|
    |q_i|.|k_j| + |bias_ij|), the score-changing variants' roundings, the matmul inputs' rounding u_in (TF32) and
    the inputs' own errors dq, dk (multi-head attention's projections). (B, Hq, Lq, Lk)."""
    q, k = att.q, att.k
    dk = _per_query_head(att, dk)
    abs_scores = np.abs(q) @ np.swapaxes(np.abs(k), -1, -2) * abs(att.scale)
    finite_bias = np.where(np.isfinite(att.bias), np.abs(att.bias), 0.0)
    score_error = u * (math.sqrt(q.shape[-1]) * abs_scores + finite_bias) + tf32_input_constant() * 2 * u_in * abs_scores
    score_error = score_error + _variant_score_error(att, u)
    if dq is not None:
        score_error = score_error + abs(att.scale) * (
            dq @ np.swapaxes(np.abs(k), -1, -2) + np.abs(q) @ np.swapaxes(dk, -1, -2)
        )
    return score_error


def _sdpa_terms(att: oracle.Attention, u: float, dq=None, dk=None, dv=None, u_in: float = 0.0):
    """Allowed error per output element of sdpa, given optional absolute input errors dq, dk, dv.

    ``u_in`` is the relative rounding of each matmul input (multi-head attention declared TF32: 2^-11, else 0); it
    adds 2 u_in |scale| |q_i|.|k_j| to each score error and 2 u_in V_i to each output row (P and v rounded before
    P @ V), times c_in (spec/tolerances.yaml, tf32)."""
    v, weights, lk = att.v, att.weights, att.k.shape[-2]
    dv = _per_query_head(att, dv)
    c_in = tf32_input_constant()
    score_error = _first_order_score_errors(att, u, dq, dk, u_in)
    attended = weights > 0
    v_row_max = np.max(np.abs(v), axis=-1)[..., None, :]  # (B, H, 1, Lk)
    v_max = np.max(np.where(attended, v_row_max, 0.0), axis=-1, keepdims=True)
    # A fully masked row attends nothing; under the 'uniform' policy it averages all of v.
    empty = ~attended.any(axis=-1, keepdims=True)
    v_max = np.where(empty, np.max(v_row_max, axis=-1, keepdims=True), v_max)
    weighted = np.sum(weights * score_error, axis=-1, keepdims=True)
    terms = lk
    if att.sink is not None:
        # The sink as one more term of the normaliser, a key of value 0 (spec/tolerances.yaml, variants): its logit
        # rounded and shifted, c_sink u (|sigma| + |sigma - m|), weighted by its own weight p_0; every key's shift
        # grows by m - max_l s_l where the sink is the maximum; the normaliser sums Lk + 1 terms.
        c = _variant_constants()
        sink = att.sink
        m, above = _sink_shift(att.scores, sink)
        p_sink = np.exp(sink - m) / (np.sum(np.exp(att.scores - m), axis=-1, keepdims=True) + np.exp(sink - m))
        weighted = weighted + c["c_sink"] * u * (np.sum(weights, axis=-1, keepdims=True) * above
                                                 + p_sink * (np.abs(sink) + np.abs(sink - m)))
        terms = lk + 1
    allowed = sdpa_row_bound(u, v_max, weighted, accumulation_growth(weights, v, terms, u))
    allowed = allowed + c_in * 2 * u_in * v_max
    if dv is not None:
        allowed = allowed + weights @ dv
    return allowed


# ------------------------------------------------------------------ 16-bit dtypes
# spec/tolerances.yaml, section sixteen_bit: float16 and bfloat16 get a model of what a correct
# 16-bit computation really does (one rounding to the dtype per operation, float32 accumulators),
# with random-walk sums over independent roundings, per output element.

SIXTEEN_BIT = ("float16", "bfloat16")


def is_sixteen_bit(dtype: str) -> bool:
    return dtype in SIXTEEN_BIT


@functools.lru_cache(maxsize=None)
def _sixteen_bit_constants() -> dict:
    section = model()["sixteen_bit"]
    factor = float(section["safety_factor"])
    return {key: float(value) * factor for key, value in section.items() if key.startswith("c_")}


def _accumulator_roundoff() -> float:
    return unit_roundoff(model()["sixteen_bit"]["accumulator"])


def _sixteen_bit_walk_factor() -> float:
    return float(model()["sixteen_bit"]["walk_factor"])


def _sixteen_bit_underflow(u: float) -> float:
    """The smallest positive normal number of the 16-bit dtype whose unit roundoff is u."""
    for dtype in SIXTEEN_BIT:
        if unit_roundoff(dtype) == u:
            return smallest_normal(dtype)
    raise ValueError(f"no 16-bit dtype has unit roundoff {u}")


def operand_group_sizes(x: np.ndarray, u: float) -> np.ndarray:
    """For each element of ``x`` (values of a format of unit roundoff ``u``), how many elements of its row (the last
    axis) share its significand: scaled by one factor, they round with the same relative error (1 where the
    significand is the row's only one; zeros count among themselves and add nothing)."""
    bits = int(round(-math.log2(u)))  # significand bits: float16 11, bfloat16 8
    significand = np.rint(np.frexp(np.abs(x))[0] * 2.0**bits).astype(np.int64)  # 2^(bits-1) .. 2^bits - 1, or 0
    kinds = 2 ** (bits - 1) + 1
    ids = np.where(significand > 0, significand - 2 ** (bits - 1) + 1, 0)
    rows = int(np.prod(x.shape[:-1]))
    keys = ids.reshape(rows, -1) + (np.arange(rows) * kinds)[:, None]
    return np.bincount(keys.ravel(), minlength=rows * kinds)[keys].reshape(x.shape).astype(np.float64)


def _sixteen_bit_scores(att: oracle.Attention, u: float, dq=None, dk=None, u_acc=None):
    """The 16-bit model's scores of a case (spec/tolerances.yaml, sixteen_bit): (attended, log_p, p, delta) over the
    keys and, with a learnable sink, its column last: where a key is attended, the exact weights p (their logs log_p)
    and delta_ij, what each score's roundings and its inputs' errors (dq, dk: the projections' or a quantization's)
    may move it by. ``u_acc``: the accumulators' unit roundoff (default float32's)."""
    c = _sixteen_bit_constants()
    u_acc = _accumulator_roundoff() if u_acc is None else u_acc
    q, k = att.q, att.k
    dk = _per_query_head(att, dk)
    d = q.shape[-1]
    scale_value = att.scale
    kt = np.swapaxes(k, -1, -2)
    raw = att.raw  # scale * q . k
    # What the softmax sees (softcap, ALiBi and the float mask applied); -inf where a key is removed.
    # A key is attended where its score is finite, not where its float64 weight is > 0: a weight below
    # 1e-308 underflows to 0 there, yet a bfloat16 score offset by a float mask of -1e9 (spacing 4e6)
    # can make it the largest (a gap of 1384 between two such scores failed correct paths 409x).
    s_full = att.scores
    sink = att.sink
    if sink is not None:
        # The learnable sink is one more column of the normaliser, a key of value 0 (spec/tolerances.yaml, variants):
        # every bound below then holds for it as for a key. Its logit is never a product (raw 0 there).
        column = np.broadcast_to(sink, s_full.shape[:-1] + (1,))
        s_full = np.concatenate([s_full, column], axis=-1)
        raw = np.concatenate([raw, np.zeros_like(column)], axis=-1)
    attended = np.isfinite(s_full)
    s = np.where(attended, s_full, 0.0)
    row_max = np.max(np.where(attended, s, -np.inf), axis=-1, keepdims=True)
    shift = np.where(attended, s - np.where(np.isfinite(row_max), row_max, 0.0), 0.0)
    with np.errstate(divide="ignore"):
        log_p = np.where(attended, shift - np.log(np.sum(np.where(attended, np.exp(shift), 0.0), axis=-1,
                                                                keepdims=True)), -np.inf)
    p = np.exp(log_p)  # the exact weights; 0 on removed keys and on fully masked rows
    # delta_ij: the score's own roundings (product, scale, mask addition, max shift) and its float32 sum.
    delta = u * (c["c_score_round"] * np.abs(raw) + np.abs(s) + np.abs(shift))
    keys_delta = c["c_acc"] * u_acc * math.sqrt(d) * abs(scale_value) * (np.abs(q) @ np.abs(kt))
    if dq is None:
        # An operand rounded to the dtype before the product (q * scale first, as BART, Whisper and Flax do): each
        # element off by u |scale q_id|, their effects on the score a random walk over d, except that entries
        # sharing a significand round alike and add linearly (operand_group_sizes: the walk over their groups,
        # each group's sum bounded by Cauchy-Schwarz). Where q's own error is given (dq: a projection's or a
        # quantization's rounding), the dq term below already counts it.
        walk = ((q * q) * operand_group_sizes(q, u)) @ (kt * kt)
        keys_delta = keys_delta + c["c_operand"] * u * abs(scale_value) * np.sqrt(walk)
    keys_delta = keys_delta + _variant_score_error(att, u, sixteen_bit=True)
    if dq is not None:
        keys_delta = keys_delta + abs(scale_value) * np.sqrt((dq * dq) @ (kt * kt)
                                                             + (q * q) @ np.swapaxes(dk * dk, -1, -2))
    if sink is not None:  # the sink's logit rounded to the dtype and shifted: c_sink u (|sigma| + |sigma - m|)
        delta[..., -1:] *= _variant_constants(sixteen_bit=True)["c_sink"]
        keys_delta = np.concatenate([np.broadcast_to(keys_delta, delta[..., :-1].shape),
                                     np.zeros(delta.shape[:-1] + (1,))], axis=-1)
    return attended, log_p, p, np.where(attended, delta + keys_delta, 0.0)


def moved_weight_bound(p: np.ndarray, log_p: np.ndarray, x: np.ndarray, attended: np.ndarray,
                       rounding: float | np.ndarray = 0.0) -> np.ndarray:
    """p (e^x - 1 + rounding): how far a weight p = e^(log p) moves when its score and its row's normaliser move by x
    in all (the 16-bit forward and the backward's weights). In log space where that overflows: e^(log p + x), at most
    1, where x > 700 or p underflowed to 0 (a weight of 1e-300 whose score may move by 4e6 can become the largest);
    0 on keys not attended."""
    with np.errstate(over="ignore", invalid="ignore"):
        exact = p * (np.expm1(np.minimum(x, 700.0)) + rounding)
        beyond = np.exp(np.minimum(log_p + x, 0.0))
    return np.where((x <= 700.0) & (p > 0), exact, np.where(attended, beyond, 0.0))


def _sdpa16_terms(att: oracle.Attention, u: float, dq=None, dk=None, dv=None, u_acc=None):
    """Allowed error per output element (B, Hq, Lq, Dv) of a 16-bit sdpa (spec/tolerances.yaml, sixteen_bit).

    dq, dk, dv: optional absolute errors of the inputs (the projections of multi_head_attention),
    independent per element; they add to the score errors and to the output as random walks.
    ``u_acc``: the accumulators' unit roundoff (default float32's; 8-bit tensor cores keep fewer bits, eight_bit)."""
    c = _sixteen_bit_constants()
    u_acc = _accumulator_roundoff() if u_acc is None else u_acc
    attended, log_p, p, delta = _sixteen_bit_scores(att, u, dq, dk, u_acc)
    v, dv, lk = att.v, _per_query_head(att, dv), att.k.shape[-2]
    # P @ V's sum grows as Lk where its summands coincide (weights rounded to the dtype first: those within 2 u of
    # each other may become one value), else as sqrt(Lk). The sink takes no value: it is not a summand.
    growth = accumulation_growth(p[..., :lk], v, lk, u_acc, weights_rounding=u)
    if att.sink is not None:  # the sink's column takes no value
        v = np.concatenate([v, np.zeros(v.shape[:-2] + (1, v.shape[-1]))], axis=-2)
        if dv is not None:
            dv = np.concatenate([dv, np.zeros(dv.shape[:-2] + (1, dv.shape[-1]))], axis=-2)
    o = p @ v
    # Score errors move the output by sum_j (p'_j - p_j) (v_j - o), p'_j the weights of the perturbed scores,
    # summed as a random walk over the keys (independent roundings). |p'_j - p_j| is bounded two ways, both exact
    # (not first order, for large 16-bit scores): by (1/Z') p_j (exp(delta_j) - 1) with Z' >= exp(-sum_l p_l delta_l),
    # tight for small errors, and by min(1, p_j (exp(delta_j + log sum_l p_l exp(delta_l)) - 1)), which stays <= 1
    # where a rounding can swap the leading keys. Each gives a bound of the same sum: the smaller one holds.
    total = np.sum(p * delta, axis=-1, keepdims=True)
    # Both bounds are evaluated in log space where exp would overflow: a weight of 1e-300 whose score may be off by
    # 4e6 (a bfloat16 score offset by a float mask of -1e9, spacing 4e6 there) can become the largest; clipping the
    # exponent at 700 instead had bounded its change by 1e-4 and failed a correct bfloat16 implementation 3x over.
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        log_expm1 = np.log(np.expm1(np.minimum(delta, 700.0))) + np.maximum(delta - 700.0, 0.0)
        small = np.where(attended, np.exp(np.minimum(log_p + log_expm1 + total, 710.0)), 0.0)  # > 1: bound unused
        top = np.max(delta, axis=-1, keepdims=True)
        log_z = top + np.log(np.maximum(np.sum(np.exp(log_p + delta - top), axis=-1, keepdims=True), 1e-300))
        large = np.where(attended, np.minimum(1.0, moved_weight_bound(p, log_p, delta + log_z, attended)), 0.0)

    v_squared, v_abs = v * v, np.abs(v)

    def walk(w):
        w2 = w * w  # sum_j w_j^2 (v_jd - o_id)^2, expanded into matrix products
        return np.sqrt(np.maximum(w2 @ v_squared - 2.0 * o * (w2 @ v) + o * o * np.sum(w2, axis=-1, keepdims=True),
                                  0.0))

    def linear(w):
        return w @ v_abs + np.abs(o) * np.sum(w, axis=-1, keepdims=True)  # >= sum_j w_j |v_jd - o_id|

    def moved(w):
        # The random walk assumes many independent roundings; over a few keys whose roundings all come near
        # their bound (scores offset by a large mask value) the sum can exceed it. The linear sum bounds it
        # always: take it where it is at most walk_factor times the walk.
        return np.minimum(linear(w), _sixteen_bit_walk_factor() * walk(w))

    with np.errstate(over="ignore", invalid="ignore"):
        # the expansion cancels badly for weights far above 1: there the first bound is not used
        first_usable = np.max(small, axis=-1, keepdims=True) <= 1.0
        moved_large = moved(large)  # once: these products were a tenth of a default run's tolerance time twice over
        score_term = c["c_score"] * (np.where(first_usable, np.minimum(moved(np.minimum(small, 1.0)), moved_large),
                                              moved_large) if first_usable.any() else moved_large)
    p2 = p * p
    allowed = (
        c["c_out"] * u * np.abs(o)  # the output's rounding and the normaliser's
        + c["c_p"] * u * np.sqrt(p2 @ v_squared)  # each weight rounded to the dtype before P @ V
        + c["c_acc"] * u_acc * growth * (p @ v_abs)  # the float32 accumulation of P @ V
        + score_term
    )
    if dv is not None:
        allowed = allowed + np.sqrt(p2 @ (dv * dv))
    # Near 0 the dtype's rounding is absolute, not relative (float16 is subnormal below 6.1e-5): the output
    # and each weight rounded to the dtype may be off by u * eta, eta the smallest normal number.
    eta = _sixteen_bit_underflow(u)
    allowed = allowed + eta * u * (c["c_out"] + c["c_p"] * np.sqrt(attended.astype(np.float64) @ v_squared))
    return np.nan_to_num(allowed, nan=np.inf, posinf=np.inf)


def attention_allowed(att: oracle.Attention, dtype: str, policy: str = "zeros", tf32: bool = False,
                      output_dtype: str | None = None) -> np.ndarray:
    """The allowed error of an sdpa case (B, Hq, Lq, Dv or 1), from the oracle's Attention of it (its intermediates
    read, never computed again). An 8-bit case's Attention holds q, k, v dequantized; ``output_dtype`` is its
    output's dtype (FP8_OUTPUT_DTYPE, default bfloat16)."""
    if is_eight_bit(dtype):
        output_dtype = output_dtype or "bfloat16"
        u = unit_roundoff(output_dtype)  # a fully masked row's 'uniform' bound: the output dtype's rounding
        allowed = _sdpa8_terms(att, dtype, output_dtype)
    elif is_sixteen_bit(dtype):
        u = unit_roundoff(dtype)
        allowed = _sdpa16_terms(att, u)
    elif tf32 and dtype == "float32":
        # TF32 rounds the matmul inputs to float16's unit roundoff and nothing else: at most a float16 computation's
        # errors, so the sixteen_bit model at that roundoff (spec/tolerances.yaml, tf32), never below float32's.
        u = unit_roundoff(TF32_MODEL_DTYPE)
        allowed = np.maximum(_sdpa16_terms(att, u), _sdpa_terms(att, unit_roundoff(dtype)))
    else:
        u = unit_roundoff(dtype)
        allowed = _sdpa_terms(att, u)
    # Rows without keys: exactly 0 under 'zeros', and with a learnable sink under every policy (its weight takes
    # the whole row: oracle.attention_weights).
    empty = att.keyless[..., None]
    if policy == "uniform" and att.sink is None and empty.any():
        # a fully masked row is the mean of v: the first-order model's bound for it
        return np.where(empty, uniform_row_bound(u, att.v, att.q.shape[1]), allowed)
    return np.where(empty, 0.0, allowed)


def lse_allowed(att: oracle.Attention, dtype: str, tf32: bool = False, sink: str = "included") -> np.ndarray:
    """The allowed error of each row's log-sum-exp (B, Hq, Lq) in log space (spec/tolerances.yaml, lse), from the
    oracle's Attention of the case: its scores' errors (the model the output's allowance uses, first-order or
    16-bit) moved through the log-sum-exp, log sum_j p_j exp(delta_j); the shift s_j - m rounded in the
    accumulator; the sum of the exponentials (sqrt(n) terms, n where they coincide); the log and the lse rounded
    to float32 (in 16 bits, each exponential rounded to the dtype too). ``sink``: LSE_CONVENTION's, the learnable
    sink's term in the denominator or not. A row without keys is exact: -inf, or the sink's logit rounded to
    float32."""
    c = _constants("lse")
    u_lse = unit_roundoff("float32")
    u_acc = unit_roundoff("float64") if dtype == "float64" else unit_roundoff("float32")
    with_sink = att.sink is not None and sink == "included"
    if is_sixteen_bit(dtype) or (tf32 and dtype == "float32"):
        u = unit_roundoff(TF32_MODEL_DTYPE if tf32 and dtype == "float32" else dtype)
        attended, log_p, p, delta = _sixteen_bit_scores(att, u)
        if att.sink is not None and not with_sink:  # the lse of the keys alone: the sink's column is no term
            attended, delta = attended[..., :-1], delta[..., :-1]
            log_p, p = _log_weights(att.scores)
    else:
        delta = _first_order_score_errors(att, unit_roundoff(dtype))
        scores = att.scores
        if with_sink:  # the sink's logit rounded and shifted, c_sink u (|sigma| + |sigma - m|) (section variants)
            column = np.broadcast_to(att.sink, scores.shape[:-1] + (1,))
            m, _ = _sink_shift(scores, att.sink)
            sink_error = _variant_constants()["c_sink"] * unit_roundoff(dtype) * (np.abs(column) + np.abs(column - m))
            scores = np.concatenate([scores, column], axis=-1)
            delta = np.concatenate([np.broadcast_to(delta, scores[..., :-1].shape), sink_error], axis=-1)
        attended = np.isfinite(scores)
        log_p, p = _log_weights(scores)
        delta = np.where(attended, delta, 0.0)
    scores = att.scores if not with_sink else np.concatenate(
        [att.scores, np.broadcast_to(att.sink, att.scores.shape[:-1] + (1,))], axis=-1)
    top = np.max(np.where(attended, scores, -np.inf), axis=-1, keepdims=True)
    keyless = ~attended.any(axis=-1)
    shift = np.where(attended, np.abs(scores - np.where(np.isfinite(top), top, 0.0)), 0.0)  # |s_j - m|
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        moved = np.max(np.where(attended, delta, -np.inf), axis=-1, keepdims=True)
        # log sum_j p_j exp(delta_j), evaluated around its largest exponent (a 16-bit score's delta may be large)
        score_term = moved + np.log(np.maximum(np.sum(np.where(attended, p * np.exp(delta - moved), 0.0), axis=-1,
                                                      keepdims=True), 1e-300))
        log_sum = np.log(np.maximum(np.sum(np.where(attended, np.exp(-shift), 0.0), axis=-1, keepdims=True), 1e-300))
    terms = attended.sum(axis=-1, keepdims=True)
    growth = accumulation_growth(np.where(attended, p, 0.0), np.ones(p.shape[:2] + (p.shape[-1], 1)),
                                 p.shape[-1], u_acc)
    growth = np.minimum(np.broadcast_to(growth, terms.shape), terms)  # never more than the row's terms
    lse = att.lse(sink)[..., None]
    # A 16-bit path may round each exp(s_j - m) to its dtype before the float32 sum (numpy_native does): Z off by u
    # relative at most, sum_j p_j u.
    terms_rounding = unit_roundoff(dtype) if is_sixteen_bit(dtype) else 0.0
    allowed = (c["c_score"] * np.where(keyless[..., None], 0.0, score_term) + c["c_exp"] * terms_rounding
               + c["c_shift"] * u_acc * np.sum(p * shift, axis=-1, keepdims=True)
               + c["c_acc"] * u_acc * growth
               + c["c_out"] * (u_acc * np.abs(log_sum) + u_lse * np.where(np.isfinite(lse), np.abs(lse), 0.0)))
    return np.where(keyless[..., None], u_lse * np.where(np.isfinite(lse), np.abs(lse), 0.0), allowed)[..., 0]


def _log_weights(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log p, p): the exact softmax weights of ``scores`` along the keys, -inf / 0 where a key is removed."""
    attended = np.isfinite(scores)
    top = np.max(np.where(attended, scores, -np.inf), axis=-1, keepdims=True)
    shift = np.where(attended, scores - np.where(np.isfinite(top), top, 0.0), 0.0)
    with np.errstate(divide="ignore"):
        log_p = np.where(attended, shift - np.log(np.sum(np.where(attended, np.exp(shift), 0.0), axis=-1,
                                                                keepdims=True)), -np.inf)
    return log_p, np.exp(log_p)


def sdpa_allowed(q, k, v, mask, is_causal, scale, dtype: str, policy: str = "zeros", tf32: bool = False,
                 output_dtype: str | None = None, **variants) -> np.ndarray:
    """``attention_allowed`` of an sdpa case given by its inputs (the oracle's Attention computed here, once).
    ``variants``: the variant keywords of the case (oracle.variant_options). An 8-bit case passes q, k, v
    dequantized (section eight_bit)."""
    return attention_allowed(oracle.attention(q, k, v, mask, is_causal, scale, **variants), dtype, policy, tf32,
                             output_dtype)


def _mha16_allowed(query, key, value, params, num_heads, dtype: str, trace: dict) -> np.ndarray:
    """spec/tolerances.yaml, sixteen_bit: each projection rounded to the dtype (float32 accumulators), the
    16-bit sdpa model with those input errors, the output projection of the context's error. ``trace``: the
    oracle's multi_head_attention of the case (the heads' Attention among it)."""
    u = unit_roundoff(dtype)
    u_acc = _accumulator_roundoff()
    c = _sixteen_bit_constants()
    p = {name: np.asarray(a, dtype=np.float64) for name, a in params.items()}

    def projection_error(x, name):
        x = np.asarray(x, dtype=np.float64)
        w = p["w_" + name]
        product = x @ w
        result = product + p.get("b_" + name, 0.0)
        return c["c_proj"] * u * (np.abs(product) + np.abs(result)) + c["c_acc"] * u_acc * math.sqrt(
            x.shape[-1]) * (np.abs(x) @ np.abs(w))

    def split(x):
        b, length, width = x.shape
        return np.swapaxes(x.reshape(b, length, num_heads, width // num_heads), 1, 2)

    dq, dk, dv = (split(projection_error(x, n)) for x, n in ((query, "q"), (key, "k"), (value, "v")))
    heads = trace["attention"]
    context_error = _sdpa16_terms(heads, u, dq, dk, dv)
    empty = heads.empty[..., None]
    # A fully masked row is zeros or, where declared, the mean of v: the first-order model's bound for it.
    spread = uniform_row_bound(u, trace["v_heads"], trace["v_heads"].shape[1])
    context_error = np.where(empty, spread, np.broadcast_to(context_error, trace["context"].shape))
    merged_error = np.swapaxes(context_error, 1, 2).reshape(trace["merged"].shape)
    # The context's errors of one row are correlated across its elements (shared weights): summed linearly.
    return merged_error @ np.abs(p["w_o"]) + projection_error(trace["merged"], "o")


def mha_allowed(query, key, value, params, num_heads, mask, is_causal, dtype: str, tf32: bool = False,
                trace: dict | None = None, **variants) -> np.ndarray:
    """``variants``: the case's variant keywords (mha.variants), each head's attention bounded as sdpa's with them
    (the variants section of spec/tolerances.yaml); query_lengths changes nothing here (padding rows are not
    judged). ``trace``: the oracle's multi_head_attention trace of the case under the 'zeros' policy, where the
    caller has it (computed here otherwise)."""
    if trace is None:
        trace = {}
        oracle.multi_head_attention(query, key, value, params, num_heads, mask, is_causal, trace=trace, **variants)
    if is_sixteen_bit(dtype):
        return _mha16_allowed(query, key, value, params, num_heads, dtype, trace)
    # Declared TF32: the first-order input rounding (spec/tolerances.yaml, tf32), not the sixteen_bit model sdpa takes:
    # TF32 by truncation, whose errors add linearly through the projections, used 1.3x that model.
    context_error = mha_context_allowed(query, key, value, params, num_heads, dtype, trace, tf32)[3]
    merged_error = np.swapaxes(context_error, 1, 2).reshape(trace["merged"].shape)
    return merged_error @ np.abs(np.asarray(params["w_o"], dtype=np.float64)) + \
        mha_projection_error(trace["merged"], params, "o", dtype, tf32)


def mha_projection_error(x, params, name: str, dtype: str, tf32: bool = False) -> np.ndarray:
    """The first-order model's allowed error of one projection x @ w_name (+ b_name) of multi_head_attention
    (spec/tolerances.yaml, multi_head_attention; declared TF32: its input rounding, section tf32)."""
    u, u_in = unit_roundoff(dtype), (tf32_unit_roundoff() if tf32 else 0.0)
    x = np.abs(np.asarray(x, dtype=np.float64))
    w = np.abs(np.asarray(params["w_" + name], dtype=np.float64))
    b = np.abs(np.asarray(params.get("b_" + name, 0.0), dtype=np.float64))
    return _constants("multi_head_attention")["c_proj"] * u * (math.sqrt(x.shape[-1]) * (x @ w) + b) \
        + tf32_input_constant() * 2 * u_in * (x @ w)


def mha_context_allowed(query, key, value, params, num_heads, dtype: str, trace: dict, tf32: bool = False) -> tuple:
    """(dq, dk, dv, context) of the first-order multi_head_attention model: the allowed errors of the heads' q, k, v
    (B, H, L, D) (the projections', split) and of the heads' context (B, H, Lq, Dv) they and the attention's own
    rounding give. ``trace``: the oracle's multi_head_attention trace of the case. The gradients' model
    (conformance/judging/gradients.py, grad.mha) starts from these."""
    u, u_in = unit_roundoff(dtype), (tf32_unit_roundoff() if tf32 else 0.0)

    def split(x):
        b, length, width = x.shape
        return np.swapaxes(x.reshape(b, length, num_heads, width // num_heads), 1, 2)

    dq, dk, dv = (split(mha_projection_error(x, params, n, dtype, tf32)) for x, n in ((query, "q"), (key, "k"),
                                                                                     (value, "v")))
    context_error = _sdpa_terms(trace["attention"], u, dq, dk, dv, u_in=u_in)
    return dq, dk, dv, np.broadcast_to(context_error, trace["context"].shape)


# ------------------------------------------------------------------ 8-bit inputs (FP8)
# spec/tolerances.yaml, section eight_bit: FP8 q, k, v with descale factors. The inputs are exact (the oracle and
# this model see the dequantized values); the error is the accumulation, the rounding of P to the 8-bit format
# before P @ V (FlashAttention 3), the output's rounding, and, for a path that dequantizes to its output dtype
# and computes there, that dtype's roundings: the sixteen_bit model in the output dtype, with the 8-bit
# accumulators, plus two terms of P's 8-bit rounding.


@functools.lru_cache(maxsize=None)
def _eight_bit() -> dict:
    section = model()["eight_bit"]
    factor = float(section["safety_factor"])
    return {**section, **{key: float(value) * factor for key, value in section.items() if key.startswith("c_")}}


def eight_bit_unit_roundoff(dtype: str) -> float:
    """The unit roundoff of an 8-bit format: 2^-4 (e4m3fn, 3 mantissa bits), 2^-3 (e5m2, 2)."""
    return float(model()["eight_bit"]["unit_roundoff"][dtype])


def _rounding_groups(p: np.ndarray, v: np.ndarray, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row of the weights p (B, Hq, Lq, Lk) and feature d of v (B, Hq, Lk, Dv): (sqrt(sum_g S_gd^2),
    sqrt(sum_g P_g^2)) over the cells g of ratio ``ratio`` that its weights fall in (floor(log p / log ratio)),
    S_gd = sum_{j in g} p_j v_jd (signed) and P_g = sum_{j in g} p_j. Weights that close may round alike: their
    errors are taken as one (spec/tolerances.yaml, eight_bit)."""
    b, h, lq, lk = p.shape
    dv = v.shape[-1]
    rows = p.reshape(-1, lk)
    order = np.argsort(rows, axis=-1, kind="stable")
    weights = np.take_along_axis(rows, order, axis=-1)
    with np.errstate(divide="ignore"):
        cell = np.where(weights > 0, np.floor(np.log(np.where(weights > 0, weights, 1.0)) / math.log(ratio)), -np.inf)
    starts = np.ones_like(weights, dtype=bool)
    starts[:, 1:] = cell[:, 1:] != cell[:, :-1]
    first = np.flatnonzero(starts)
    # v's rows in each weight row's order, gathered straight from (B * Hq * Lk, Dv): row r is of head r // Lq
    head = (np.arange(rows.shape[0]) // lq)[:, None] * lk
    values = v.reshape(-1, dv)[(head + order).ravel()]
    sums = np.add.reduceat(weights.reshape(-1, 1) * values, first, axis=0)  # S_gd, the groups in row order
    totals = np.add.reduceat(weights.ravel(), first)  # P_g
    row_first = np.searchsorted(first // lk, np.arange(rows.shape[0]))  # every row starts a group at j = 0
    signed = np.sqrt(np.add.reduceat(sums * sums, row_first, axis=0)).reshape(b, h, lq, dv)
    mass = np.sqrt(np.add.reduceat(totals * totals, row_first)).reshape(b, h, lq, 1)
    return signed, mass


def _sdpa8_terms(att: oracle.Attention, dtype: str, output_dtype: str) -> np.ndarray:
    """Allowed error per output element (B, Hq, Lq, Dv) of sdpa on 8-bit inputs (spec/tolerances.yaml, eight_bit);
    the Attention of the dequantized q, k, v (float64)."""
    c = _eight_bit()
    u = unit_roundoff(output_dtype)
    u8 = eight_bit_unit_roundoff(dtype)
    # A path that dequantizes to its output dtype rounds each input once there: independent errors c_in u |x|.
    base = _sdpa16_terms(att, u, c["c_in"] * u * np.abs(att.q), c["c_in"] * u * np.abs(att.k),
                         c["c_in"] * u * np.abs(att.v), u_acc=float(c["accumulator_roundoff"]))
    v, p = att.v, att.weights
    o = p @ v
    v2, v_abs, o_abs = v * v, np.abs(v), np.abs(o)
    # P rounded to the 8-bit format before P @ V: e_ij = delta_g p_ij + r_ij, delta_g (|.| <= u8) shared by the weights
    # of one cell g of the format (they may round alike), |r_ij| <= 2 u8 p_ij the rest; a random walk across cells
    # and across the rests, against v_j (or v_j - o, a normaliser from the rounded P: + |o|). The linear bound
    # sum_j |e_ij| (|v_jd| + |o_id|) always holds.
    # The keys at the row's largest score round exactly: P there is 2^offset (e^0 at the running maximum when their
    # block is reached), which the 8-bit formats hold; only the other keys' weights are rounded.
    top = np.max(p, axis=-1, keepdims=True)
    rounded = np.where(p < top, p, 0.0)
    signed, mass = _rounding_groups(rounded, v, 1.0 + 2.0 * u8)
    p2 = rounded * rounded
    walk = signed + o_abs * mass + 2.0 * (np.sqrt(p2 @ v2) + o_abs * np.sqrt(np.sum(p2, axis=-1, keepdims=True)))
    linear = rounded @ v_abs + o_abs * np.sum(rounded, axis=-1, keepdims=True)
    rounding = c["c_p"] * u8 * np.minimum(walk, linear)
    # Weights below the format's normal range after FlashAttention 3's offset (P = 2^offset e^(s - m), m the running
    # maximum <= the row's) round to a multiple of the subnormal spacing: at most min(p, eta / l) each, eta half
    # the spacing over 2^offset and l = 1 / max_j p_j the normaliser; rounding to 0 is biased, so linear.
    scaled = float(2.0 ** int(c["offset_bits"]))
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = np.where(top > 0, p / np.where(top > 0, top, 1.0), 0.0)  # e^(s_j - max_l s_l)
    tiny = (p > 0) & (relative * scaled < float(c["smallest_normal"][dtype]))
    eta = float(c["smallest_subnormal"][dtype]) / 2.0 / scaled
    lost = np.where(tiny, np.minimum(p, eta * top), 0.0)
    underflow = c["c_underflow"] * (lost @ v_abs + o_abs * np.sum(lost, axis=-1, keepdims=True))
    return base + rounding + underflow

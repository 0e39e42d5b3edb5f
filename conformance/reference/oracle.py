"""The float64 oracle: attention as the spec defines it, written for clarity, not speed.

Every function takes NumPy arrays (any float dtype; they are widened to float64
first, which is exact) and returns float64. The suite compares implementations
with these functions on the very same inputs, already rounded to the dtype under
test, so the comparison measures the implementation's arithmetic alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from attention_conformance.implementations.region import variant_options


def _f64(x) -> np.ndarray:
    """``x`` as float64; a float64 array as it is (nothing here writes into an input)."""
    return np.asarray(x, dtype=np.float64)


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


def positions_allowed(lq: int, lk: int, is_causal: bool = False, window=None, query_offset: int = 0,
                      key_lengths=None, *, sink_token_length: int = 0, attention_chunk=None,
                      key_leftpad=None, padding_removed: bool = True, xp=np):
    """(B or 1, 1, lq, lk) boolean: the keys the causal band, the window, the chunk, the key lengths and the left
    padding leave to each query.

    Query row i sits at position p_i = query_offset + i, key j at j (spec/clauses.yaml, sdpa.query-offset):
    is_causal keeps j <= p_i; window=(left, right) keeps p_i - left <= j <= p_i + right (both edges
    inclusive, None unbounded on that side: sdpa.window); key_lengths[b] keeps j < key_lengths[b] (sdpa.varlen).
    key_leftpad[b] = P removes keys j < P and counts positions from the first real key: key j at j - P, query row
    i at p_i - P (sdpa.key-leftpad). Differences of positions, hence the band, the window and ALiBi, do not move;
    what counts from the first real key is the chunk and the sink tokens. attention_chunk = C keeps the keys of
    the query's chunk, floor((j - P) / C) = floor((p_i - P) / C) (sdpa.attention-chunk); the first
    sink_token_length real keys, 0 <= j - P < n, escape the window's left edge only (sdpa.sink-tokens).

    ``xp``: the array namespace, NumPy here; jax.numpy for jax_numpy's traced calls, whose key lengths and left
    pads may be tracers (JaxNumpy._attended_keys): the rule is written once. ``padding_removed``: False keeps the
    padding keys j < P while still counting positions from the first real key (what the band, the window and the
    chunk alone leave, judging.expected.fully_masked_causes).
    """
    pad = 0 if key_leftpad is None else xp.asarray(key_leftpad).astype(xp.int32).reshape(-1, 1, 1, 1)
    position = int(query_offset) + xp.arange(lq)[:, None] - pad  # (lq, 1) or (B, 1, lq, 1)
    key = xp.arange(lk)[None, :] - pad  # (1, lk) or (B, 1, 1, lk)
    allowed = xp.ones(xp.broadcast_shapes(position.shape, key.shape), dtype=bool)
    if is_causal:
        allowed = allowed & (key <= position)
    if window is not None:
        left, right = window
        if left is not None:
            sink_token = (key >= 0) & (key < int(sink_token_length))
            allowed = allowed & ((key >= position - int(left)) | sink_token)
        if right is not None:
            allowed = allowed & (key <= position + int(right))
    if attention_chunk is not None:
        chunk = int(attention_chunk)
        allowed = allowed & (xp.floor_divide(key, chunk) == xp.floor_divide(position, chunk))
    if key_leftpad is not None and padding_removed:
        allowed = allowed & (key >= 0)
    allowed = allowed if allowed.ndim == 4 else allowed[None, None]
    if key_lengths is not None:
        lengths = xp.asarray(key_lengths).astype(xp.int32).reshape(-1, 1, 1, 1)
        allowed = allowed & (xp.arange(lk)[None, None, None, :] < lengths)
    return allowed


def alibi_bias(slopes, lq: int, lk: int, query_offset: int = 0) -> np.ndarray:
    """(B or 1, Hq, lq, lk): -slope[b, h] * |p_i - j|, FlashAttention's ALiBi form (sdpa.alibi)."""
    slopes = _f64(slopes)
    slopes = slopes.reshape((1,) * (2 - slopes.ndim) + slopes.shape)  # (Hq,) -> (1, Hq)
    distance = np.abs(int(query_offset) + np.arange(lq)[:, None] - np.arange(lk)[None, :])
    return -slopes[:, :, None, None] * distance


def softcapped(s, softcap) -> np.ndarray:
    """softcap * tanh(s / softcap) (sdpa.softcap); None leaves s as it is."""
    return s if softcap is None else float(softcap) * np.tanh(s / float(softcap))


KEY_CHOICE = ("window", "query_offset", "key_lengths", "sink_token_length", "attention_chunk", "key_leftpad")


def key_options(variants: dict) -> dict:
    """The variant keywords among ``variants`` that remove keys (KEY_CHOICE: attention_bias's keywords)."""
    return {n: variants[n] for n in KEY_CHOICE if n in variants}


def attention_bias(mask, is_causal: bool, lq: int, lk: int, *, window=None, query_offset: int = 0,
                   key_lengths=None, sink_token_length: int = 0, attention_chunk=None, key_leftpad=None) -> np.ndarray:
    """The additive bias a mask and the key-removing options stand for: 0 or the float mask where allowed, -inf
    elsewhere.

    A boolean mask is True where the query may attend; a float mask is added as
    it is. The causal flag (shifted by query_offset), the window, the chunk, the key lengths and the
    left padding (KEY_CHOICE, positions_allowed) intersect with either. Result broadcasts to (..., lq, lk).
    """
    bias = np.zeros((lq, lk))
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == np.bool_:
            bias = np.where(mask, 0.0, -np.inf)
        else:
            bias = bias + _f64(mask)
    plain_band = window is None and key_lengths is None and not query_offset and attention_chunk is None \
        and key_leftpad is None
    if is_causal or not plain_band:
        allowed = positions_allowed(lq, lk, is_causal, window, query_offset, key_lengths,
                                    sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                                    key_leftpad=key_leftpad)
        if plain_band:
            allowed = allowed[0, 0]  # the plain causal band keeps its (lq, lk) shape
        bias = np.where(allowed, bias, -np.inf)
    return bias


def judged_rows(q, query_lengths=None) -> np.ndarray:
    """(B or 1, 1, Lq) boolean: the query rows a result is judged on; rows i >= query_lengths[b] are padding."""
    lq = np.shape(q)[-2]
    if query_lengths is None:
        return np.ones((1, 1, lq), dtype=bool)
    return np.arange(lq)[None, None, :] < np.asarray(query_lengths).astype(np.int64).reshape(-1, 1, 1)


def repeat_kv_heads(x: np.ndarray, num_query_heads: int) -> np.ndarray:
    """Grouped-query attention: query head h uses kv head h // (Hq / Hkv)."""
    group, remainder = divmod(num_query_heads, x.shape[1])
    if remainder:
        raise ValueError(f"Hq={num_query_heads} is not a multiple of Hkv={x.shape[1]}")
    return np.repeat(x, group, axis=1)


@dataclass(frozen=True)
class Attention:
    """One sdpa case as the oracle computes it, each intermediate kept (float64, kv heads repeated to Hq): the
    output under any FULLY_MASKED_ROWS policy and the tolerance model's allowed error are both read from it, so
    nothing of the case is computed twice (conformance/reference/tolerances.py takes it as it is)."""

    q: np.ndarray  # (B, Hq, Lq, Dk)
    k: np.ndarray  # (B, Hq, Lk, Dk)
    v: np.ndarray  # (B, Hq, Lk, Dv)
    scale: float  # the scale applied (1 / sqrt(Dk) by default)
    raw: np.ndarray  # scale * q . k
    capped: np.ndarray  # softcap * tanh(raw / softcap); raw itself without a softcap
    alibi: np.ndarray | None  # the ALiBi bias, broadcasting to the scores
    bias: np.ndarray  # the mask and the removed keys: 0 or the float mask where allowed, -inf elsewhere
    scores: np.ndarray  # what the softmax sees: capped + alibi + bias
    sink: np.ndarray | None  # (1, Hq, 1, 1) learnable sink logits
    weights: np.ndarray  # the softmax of the scores (with the sink in the normaliser); 0 on rows without keys
    keyless: np.ndarray  # (B, Hq, Lq) rows no key is left to (the bias alone decides)
    variants: dict = field(default_factory=dict)  # the variant keywords of the case

    @property
    def empty(self) -> np.ndarray:
        """(B, Hq, Lq): the rows FULLY_MASKED_ROWS applies to; none with a learnable sink (fully_masked_rows)."""
        return np.zeros_like(self.keyless) if self.sink is not None else self.keyless

    def output(self, policy: str = "zeros") -> np.ndarray:
        """(B, Hq, Lq, Dv): the weights times v, rows without keys under ``policy`` (sdpa)."""
        out = self.weights @ self.v
        empty = self.empty[..., None]
        if policy == "nan":
            out = np.where(empty, np.nan, out)
        elif policy == "uniform":
            out = np.where(empty, np.mean(self.v, axis=-2, keepdims=True), out)
        return out

    def lse(self, sink: str = "included") -> np.ndarray:
        """(B, Hq, Lq): the log-sum-exp of each row (lse.definition), the natural log of the softmax's denominator
        over the attended keys' scores (after scale, softcap, ALiBi and the masks): m + log sum_j exp(s_ij - m), m the
        row's largest score. With a learnable sink its term exp(sigma_h) is in the denominator (``sink``
        "included": the lse of the weights actually used, o_i = sum_j exp(s_ij - lse_i) v_j) or left out
        ("excluded"). A row without keys: -inf, or sigma_h with the sink included."""
        s = self.scores
        top = np.max(s, axis=-1, keepdims=True)
        if self.sink is not None and sink == "included":
            top = np.maximum(top, self.sink)
        shift = np.where(np.isneginf(top), 0.0, top)
        total = np.sum(np.exp(s - shift), axis=-1, keepdims=True)
        if self.sink is not None and sink == "included":
            total = total + np.exp(self.sink - shift)
        with np.errstate(divide="ignore"):  # log 0 = -inf: a row without keys (and no sink in its denominator)
            return (shift + np.log(total))[..., 0]


def _score_parts(q, k, mask, is_causal, scale, *, softcap=None, alibi_slopes=None, query_offset=0, **keys):
    """(k with its kv heads repeated, the scale, raw, capped, alibi, bias, scores) of ``scores``."""
    q, k = _f64(q), _f64(k)
    k = repeat_kv_heads(k, q.shape[1]) if q.ndim == 4 else k
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    lq, lk = q.shape[-2], k.shape[-2]
    raw = q @ np.swapaxes(k, -1, -2) * scale
    capped = softcapped(raw, softcap)
    alibi = None if alibi_slopes is None else alibi_bias(alibi_slopes, lq, lk, query_offset)
    s = capped if alibi is None else capped + alibi
    bias = attention_bias(mask, is_causal, lq, lk, query_offset=query_offset,
                          **{name: value for name, value in keys.items() if name in KEY_CHOICE})
    return k, scale, raw, capped, alibi, bias, s + bias


def scores(q, k, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
           query_offset=0, query_lengths=None, key_lengths=None, sink_token_length=0, attention_chunk=None,
           key_leftpad=None, learnable_sink=None) -> np.ndarray:
    """The matrix the softmax sees, in the order of sdpa.variant-order: s = scale q.k, then
    softcap * tanh(s / softcap), then the ALiBi bias, then the float mask; the boolean mask, the
    causal band, the window, the chunk, the key lengths and the left padding set removed keys to -inf.
    query_lengths does not change scores (padded query rows are computed and not judged); nor does
    learnable_sink, which is no key's score: it joins the normaliser only (attention_weights)."""
    return _score_parts(q, k, mask, is_causal, scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                        query_offset=query_offset, key_lengths=key_lengths, sink_token_length=sink_token_length,
                        attention_chunk=attention_chunk, key_leftpad=key_leftpad)[-1]


def sink_logits(learnable_sink, num_query_heads: int) -> np.ndarray:
    """(1, Hq, 1, 1): the learnable sink logit of each query head (sdpa.learnable-sink)."""
    sink = _f64(learnable_sink).reshape(-1)
    if sink.shape != (num_query_heads,):
        raise ValueError(f"learnable_sink has shape {np.shape(learnable_sink)}; (Hq,) = ({num_query_heads},) expected")
    return sink.reshape(1, -1, 1, 1)


def _softmax_of_scores(s: np.ndarray, sink: np.ndarray | None) -> np.ndarray:
    """attention_weights' softmax along the keys of scores ``s``, with the sink's logits in the normaliser."""
    row_max = np.max(s, axis=-1, keepdims=True)
    if sink is not None:
        row_max = np.maximum(row_max, sink)
        e = np.exp(s - row_max)
        return e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sink - row_max))
    fully_masked = np.isneginf(row_max)
    e = np.exp(s - np.where(fully_masked, 0.0, row_max))
    total = np.sum(e, axis=-1, keepdims=True)
    return np.where(fully_masked, 0.0, e / np.where(fully_masked, 1.0, total))


def attention_weights(q, k, mask=None, is_causal=False, scale=None, learnable_sink=None, **variants) -> np.ndarray:
    """softmax of the scores; a fully masked row gets all-zero weights. ``variants``: those of ``scores``.

    With ``learnable_sink`` (sdpa.learnable-sink) the sink logit sigma_h of query head h joins the normaliser and
    takes no value: p_ij = exp(s_ij - m_i) / (exp(sigma_h - m_i) + sum_l exp(s_il - m_i)), m_i = max(sigma_h,
    max_l s_il). The weights then sum to 1 - exp(sigma_h - m_i) / Z_i < 1; a row without keys has m_i = sigma_h,
    Z_i = 1 and weights exactly 0 (no 0/0: the declared FULLY_MASKED_ROWS does not apply to it).
    """
    sink = None if learnable_sink is None else sink_logits(learnable_sink, np.shape(q)[1])
    return _softmax_of_scores(scores(q, k, mask, is_causal, scale, **variants), sink)


def _keyless(bias: np.ndarray, target: tuple[int, ...]) -> np.ndarray:
    return np.all(np.isneginf(np.broadcast_to(bias, target)), axis=-1)


def fully_masked_rows(q, k, mask=None, is_causal=False, *, window=None, query_offset=0, key_lengths=None,
                      sink_token_length=0, attention_chunk=None, key_leftpad=None, learnable_sink=None,
                      **_values) -> np.ndarray:
    """(B, Hq, Lq) boolean: rows in which no key may be attended (softcap and ALiBi never remove a key).

    With a learnable sink no row is: a row without keys attends the sink alone and is exactly 0 by the
    definition (attention_weights), whatever FULLY_MASKED_ROWS an implementation declares."""
    lq, lk = q.shape[-2], k.shape[-2]
    target = q.shape[:-2] + (lq, lk)
    if learnable_sink is not None:
        return np.zeros(target[:-1], dtype=bool)
    bias = attention_bias(mask, is_causal, lq, lk, window=window, query_offset=query_offset, key_lengths=key_lengths,
                          sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                          key_leftpad=key_leftpad)
    return _keyless(bias, target)


def attention(q, k, v, mask=None, is_causal=False, scale=None, *, learnable_sink=None, query_lengths=None,
              **variants) -> Attention:
    """The sdpa case's Attention, every intermediate once (float64 q, k, v; 8-bit inputs dequantized first).
    ``variants``: sdpa's variant keywords; query_lengths changes nothing here (padding rows are not judged)."""
    q, v = _f64(q), repeat_kv_heads(_f64(v), np.shape(q)[1])
    k, scale_value, raw, capped, alibi, bias, s = _score_parts(q, k, mask, is_causal, scale, **variants)
    sink = None if learnable_sink is None else sink_logits(learnable_sink, q.shape[1])
    keyless = _keyless(bias, q.shape[:-2] + (q.shape[-2], k.shape[-2]))
    kept = dict(variants, learnable_sink=learnable_sink) if learnable_sink is not None else dict(variants)
    return Attention(q, k, v, scale_value, raw, capped, alibi, bias, s, sink, _softmax_of_scores(s, sink), keyless,
                     kept)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, fully_masked_rows_policy: str = "zeros", *, window=None,
         softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None,
         sink_token_length=0, attention_chunk=None, key_leftpad=None, q_descale=None, k_descale=None,
         v_descale=None) -> np.ndarray:
    """Scaled dot-product attention, (B, Hq, Lq, Dv) float64.

    ``fully_masked_rows_policy`` gives the result for rows with no attendable key:
    'zeros' (the canonical one), 'nan', or 'uniform' (the mean of v over all keys); with a learnable
    sink such a row is 0 under every policy (fully_masked_rows).
    The keyword-only options are the variants of the contract (docs/contract.md;
    spec/clauses.yaml sdpa.window ... sdpa.variant-order, sdpa.learnable-sink ... sdpa.key-leftpad). Rows
    i >= query_lengths[b] are padding: computed like any other row here, and never judged (judged_rows).
    8-bit q, k, v with descale factors (q_descale, k_descale, v_descale) are dequantized first (dequantize).
    """
    if q_descale is not None or k_descale is not None or v_descale is not None:
        q, k, v = dequantize(q, k, v, q_descale, k_descale, v_descale)
    return attention(q, k, v, mask, is_causal, scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                     query_offset=query_offset, key_lengths=key_lengths, learnable_sink=learnable_sink,
                     sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                     key_leftpad=key_leftpad).output(fully_masked_rows_policy)


def _projected(x, p: dict, name: str) -> np.ndarray:
    """x @ w_name (+ b_name): one projection of multi_head_attention (mha.projections)."""
    y = _f64(x) @ p["w_" + name]
    return y + p["b_" + name] if "b_" + name in p else y


def multi_head_attention(
    query, key, value, params, num_heads, mask=None, is_causal=False, trace=None, fully_masked_rows_policy="zeros",
    **variants,
):
    """Projections, split into heads, sdpa per head, merge, output projection.

    If ``trace`` is a dict it receives every intermediate by name (the names fixtures use in ``shapes``; the heads'
    Attention as "attention"). ``variants``: sdpa's variant keywords (docs/contract.md; mha.variants), applied to
    each head's attention after the projections with Hq = Hkv = num_heads: alibi_slopes (H,) or (B, H) and
    learnable_sink (H,) indexed by head h of mha.head-split. ``fully_masked_rows_policy``: one policy, or
    (B, H, Lq) names, one per head's row (its own cause's; Judge.policy), applied to the context before the merge.
    """
    trace = {} if trace is None else trace
    p = {name: _f64(value_) for name, value_ in params.items()}

    def split(x):
        b, length, width = x.shape
        return np.swapaxes(x.reshape(b, length, num_heads, width // num_heads), 1, 2)

    trace["q_proj"], trace["k_proj"], trace["v_proj"] = (_projected(x, p, n) for x, n in
                                                         ((query, "q"), (key, "k"), (value, "v")))
    # The packed layout some documents use: per position, per head, [q_h | k_h | v_h].
    b, lq, _ = trace["q_proj"].shape
    if trace["q_proj"].shape == trace["k_proj"].shape == trace["v_proj"].shape:
        heads = [split(trace[n + "_proj"]) for n in "qkv"]
        trace["qkv_packed_permuted"] = np.concatenate(heads, axis=-1)
        trace["qkv_packed_heads"] = np.swapaxes(trace["qkv_packed_permuted"], 1, 2)
        trace["qkv_packed"] = trace["qkv_packed_heads"].reshape(b, lq, -1)
    trace["q_heads"], trace["k_heads"], trace["v_heads"] = (split(trace[n + "_proj"]) for n in "qkv")
    heads = trace["attention"] = attention(trace["q_heads"], trace["k_heads"], trace["v_heads"], mask, is_causal,
                                           **variants)
    trace["scores"], trace["weights"] = heads.scores, heads.weights
    trace["context"] = _mha_context(heads, fully_masked_rows_policy)
    trace["context_transposed"] = np.swapaxes(trace["context"], 1, 2)
    trace["merged"] = trace["context_transposed"].reshape(b, lq, -1)
    trace["output"] = _projected(trace["merged"], p, "o")
    return trace["output"]


def _mha_context(heads: Attention, policy) -> np.ndarray:
    """The heads' outputs (B, H, Lq, Dv), rows without keys under ``policy`` (one, or (B, H, Lq) names)."""
    if isinstance(policy, str):
        return heads.output(policy)
    rows = np.asarray(policy)[..., None]  # each head's fully masked row under the policy of its own cause
    return sum(np.where(rows == name, heads.output(str(name)), 0.0) for name in np.unique(rows))


def mha_output(trace: dict, params, policy) -> np.ndarray:
    """multi_head_attention's output under another FULLY_MASKED_ROWS ``policy``, from the ``trace`` of a call: the
    heads' Attention merged and projected again, nothing before it recomputed."""
    context = _mha_context(trace["attention"], policy)
    merged = np.swapaxes(context, 1, 2).reshape(trace["merged"].shape)
    return _projected(merged, {name: _f64(value) for name, value in params.items()}, "o")


# ------------------------------------------------------------------ packed and paged batches
# sdpa_varlen and sdpa_paged (docs/contract.md; spec/clauses.yaml varlen.*, paged.*) are defined through the
# padded sdpa above, one sequence at a time: sequence b is an sdpa case of batch 1 with its own queries and keys,
# its queries placed by SEQUENCE_ALIGNMENT (query_offset Lk_b - Lq_b bottom-right, which is negative where a
# sequence has more queries than keys, or 0 top-left), and the variant keywords that make sense per sequence.
SEQUENCE_ALIGNMENTS = ("bottom-right", "top-left")


SEQUENCE_VARIANTS = ("window", "softcap", "alibi_slopes", "learnable_sink")


def sequence_offset(lq: int, lk: int, alignment: str = "bottom-right") -> int:
    """The query_offset of a sequence of ``lq`` queries and ``lk`` keys: lk - lq (bottom-right: the last query beside
    the last key; negative when lq > lk, the first rows then before key 0) or 0 (top-left)."""
    if alignment not in SEQUENCE_ALIGNMENTS:
        raise ValueError(f"alignment {alignment!r}: one of {SEQUENCE_ALIGNMENTS}")
    return int(lk) - int(lq) if alignment == "bottom-right" else 0


def _ints(x) -> np.ndarray:
    return np.asarray(x).astype(np.int64).reshape(-1)


def varlen_spans(cu_seqlens_q, cu_seqlens_k, seqused_k=None) -> list[tuple[int, int, int, int]]:
    """(query start, query end, key start, key end) of each sequence of a packed batch: rows cu_seqlens_q[b] ..
    cu_seqlens_q[b + 1] - 1 of q, rows cu_seqlens_k[b] .. of k and v, the first seqused_k[b] of the sequence's keys
    when given (varlen.seqused-k), else all cu_seqlens_k[b + 1] - cu_seqlens_k[b]."""
    cq, ck = _ints(cu_seqlens_q), _ints(cu_seqlens_k)
    used = None if seqused_k is None else _ints(seqused_k)
    spans = []
    for b in range(len(cq) - 1):
        key_end = int(ck[b + 1]) if used is None else int(ck[b]) + int(used[b])
        spans.append((int(cq[b]), int(cq[b + 1]), int(ck[b]), key_end))
    return spans


def paged_keys(cache, block_table, used: int, row: int) -> np.ndarray:
    """Sequence ``row``'s first ``used`` keys (or values) of a paged cache (num_blocks, block_size, Hkv, D) as
    (used, Hkv, D): its logical key j lies in page block_table[row, j // block_size] at slot j % block_size
    (paged.block-table). Pages past the last one it uses, and slots past ``used``, are never read."""
    cache = np.asarray(cache)
    block = cache.shape[1]
    pages = _ints(np.asarray(block_table)[row])[: -(-int(used) // block)]
    return cache[pages].reshape((-1,) + cache.shape[2:])[: int(used)]


def _heads_first(x: np.ndarray) -> np.ndarray:
    """(L, H, D) -> (1, H, L, D)."""
    return np.swapaxes(np.asarray(x), 0, 1)[None]


def sequence_sdpa_inputs(q, k, v, example: int, *, is_causal=False, scale=None, window=None, softcap=None,
                         alibi_slopes=None, learnable_sink=None, alignment="bottom-right") -> dict:
    """The padded sdpa case (keyword arguments of ``sdpa`` and ``tolerances.sdpa_allowed``) that defines one sequence:
    q (1, Hq, Lq, Dk) and k, v (1, Hkv, Lk, D*) of sequence ``example``, query_offset by ``alignment``, ALiBi slopes
    (Hq,) or row ``example`` of (B, Hq). A sequence without keys gets one zero key and key_lengths [0] (its rows have
    no key: 0 under the canonical policy, 0 with a learnable sink)."""
    lq, lk = q.shape[2], k.shape[2]
    case = {"q": q, "k": k, "v": v, "mask": None, "is_causal": bool(is_causal), "scale": scale}
    if lk == 0:
        case["k"], case["v"] = np.zeros(k.shape[:2] + (1, k.shape[3])), np.zeros(v.shape[:2] + (1, v.shape[3]))
        case["key_lengths"] = np.zeros(1, dtype=np.int32)
    offset = sequence_offset(lq, lk, alignment)
    if offset:
        case["query_offset"] = offset
    if window is not None:
        case["window"] = tuple(window)
    if softcap is not None:
        case["softcap"] = softcap
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes)
        case["alibi_slopes"] = slopes[example] if slopes.ndim == 2 else slopes
    if learnable_sink is not None:
        case["learnable_sink"] = learnable_sink
    return case


def sequence_cases(op: str, inputs: dict, alignment: str = "bottom-right") -> list[dict]:
    """The padded sdpa case of each sequence of an sdpa_varlen or sdpa_paged case (``inputs`` by the contract's
    names), in order; a sequence without queries is left out of none (its case has Lq = 0)."""
    options = {name: inputs.get(name) for name in ("is_causal", "scale", *SEQUENCE_VARIANTS)}
    options["is_causal"] = bool(options["is_causal"])
    if op == "sdpa_varlen":
        q, k, v = np.asarray(inputs["q"]), np.asarray(inputs["k"]), np.asarray(inputs["v"])
        spans = varlen_spans(inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], inputs.get("seqused_k"))
        return [sequence_sdpa_inputs(_heads_first(q[qs:qe]), _heads_first(k[ks:ke]), _heads_first(v[ks:ke]), b,
                                     alignment=alignment, **options)
                for b, (qs, qe, ks, ke) in enumerate(spans)]
    if op == "sdpa_paged":
        q, used = np.asarray(inputs["q"]), _ints(inputs["seqused_k"])
        return [sequence_sdpa_inputs(
                    q[b:b + 1], _heads_first(paged_keys(inputs["k_cache"], inputs["block_table"], used[b], b)),
                    _heads_first(paged_keys(inputs["v_cache"], inputs["block_table"], used[b], b)), b,
                    alignment=alignment, **options)
                for b in range(q.shape[0])]
    raise ValueError(f"{op} is not a packed or paged operation")


def _sequence_outputs(op, inputs, alignment, policy) -> list[np.ndarray]:
    outputs = []
    for case in sequence_cases(op, inputs, alignment):
        if case["q"].shape[2] == 0:
            outputs.append(np.zeros(case["q"].shape[:3] + (case["v"].shape[3],)))
            continue
        arrays = {name: case.pop(name) for name in ("q", "k", "v", "mask", "is_causal", "scale")}
        outputs.append(sdpa(arrays["q"], arrays["k"], arrays["v"], arrays["mask"], arrays["is_causal"],
                            arrays["scale"], policy, **case))
    return outputs


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, is_causal=False,
                scale=None, fully_masked_rows_policy: str = "zeros", *, seqused_k=None, window=None, softcap=None,
                alibi_slopes=None, learnable_sink=None, alignment: str = "bottom-right") -> np.ndarray:
    """Packed variable-length sdpa, (total_q, Hq, Dv) float64: rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 are
    sequence b's queries, attending only to sequence b's keys (varlen.definition). max_seqlen_q and max_seqlen_k are
    sizing hints of the contract; the result does not depend on them."""
    inputs = dict(q=_f64(q), k=_f64(k), v=_f64(v), cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                  seqused_k=seqused_k, is_causal=is_causal, scale=scale, window=window, softcap=softcap,
                  alibi_slopes=alibi_slopes, learnable_sink=learnable_sink)
    pieces = _sequence_outputs("sdpa_varlen", inputs, alignment, fully_masked_rows_policy)
    return np.concatenate([np.swapaxes(piece[0], 0, 1) for piece in pieces], axis=0)


def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None,
               fully_masked_rows_policy: str = "zeros", *, window=None, softcap=None, alibi_slopes=None,
               learnable_sink=None, alignment: str = "bottom-right") -> np.ndarray:
    """sdpa over a paged KV cache, (B, Hq, Lq, Dv) float64: sequence b's queries q[b] against its first seqused_k[b]
    keys, gathered page by page through block_table[b] (paged.definition)."""
    inputs = dict(q=_f64(q), k_cache=_f64(k_cache), v_cache=_f64(v_cache), block_table=block_table,
                  seqused_k=seqused_k, is_causal=is_causal, scale=scale, window=window, softcap=softcap,
                  alibi_slopes=alibi_slopes, learnable_sink=learnable_sink)
    return np.concatenate(_sequence_outputs("sdpa_paged", inputs, alignment, fully_masked_rows_policy), axis=0)


def mha_judged_rows(query, query_lengths=None) -> np.ndarray:
    """(B or 1, Lq, 1) boolean: the rows of a multi_head_attention output (B, Lq, E_out) a result is judged on; rows
    i >= query_lengths[b] are padding (mha.variants, as sdpa.varlen). ``query`` is (B, Lq, E)."""
    return np.swapaxes(judged_rows(query, query_lengths), 1, 2)


def mha_fully_masked_rows(inputs: dict) -> np.ndarray:
    """(B, H, Lq) boolean: the rows of each head of a multi_head_attention case (its inputs) without a key to attend
    (fully_masked_rows of the per-head attention: the mask, the causal flag and the key-removing variants)."""
    b, lq = np.shape(inputs["query"])[:2]
    heads = inputs["num_heads"]
    shaped = np.zeros((b, heads, lq, 1)), np.zeros((b, heads, np.shape(inputs["key"])[1], 1))
    return fully_masked_rows(*shaped, inputs.get("mask"), bool(inputs.get("is_causal", False)),
                             **variant_options(inputs))


# ------------------------------------------------------------------ FP8 attention
# 8-bit q, k, v carry per-head descale factors (spec/clauses.yaml sdpa.fp8-descale): the oracle computes on the
# dequantized values, exactly (a float8 value times a float32 factor is exact in float64), and everything else
# (the scale, softcap, masks, the other variants) applies to those as to any inputs.
DESCALES = ("q_descale", "k_descale", "v_descale")


def _per_kv_head(descale, batch: int, kv_heads: int, name: str) -> np.ndarray:
    """A descale factor array as (B, Hkv, 1, 1) float64; its shape must be FlashAttention 3's (B, Hkv)."""
    factors = _f64(descale)
    if factors.shape != (batch, kv_heads):
        raise ValueError(f"{name} has shape {np.shape(descale)}; (B, Hkv) = ({batch}, {kv_heads}) expected")
    return factors[:, :, None, None]


def dequantize(q, k, v, q_descale=None, k_descale=None, v_descale=None):
    """(q, k, v) in float64, each times its descale factor (None: 1), sdpa.fp8-descale: k[b, h] and v[b, h] by
    k_descale[b, h] and v_descale[b, h]; q[b, h] by q_descale[b, h // G] with G = Hq / Hkv, the kv head of the query
    head's group (FlashAttention 3's q_descale is "(b, h_k), not (b, h)")."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    batch, kv_heads = k.shape[0], k.shape[1]
    if q_descale is not None:
        q = q * repeat_kv_heads(_per_kv_head(q_descale, batch, kv_heads, "q_descale"), q.shape[1])
    if k_descale is not None:
        k = k * _per_kv_head(k_descale, batch, kv_heads, "k_descale")
    if v_descale is not None:
        v = v * _per_kv_head(v_descale, batch, kv_heads, "v_descale")
    return q, k, v


def descale_options(inputs: dict) -> dict:
    """The descale factors a case's inputs pass, by name."""
    return {name: inputs[name] for name in DESCALES if inputs.get(name) is not None}


def dequantized(inputs: dict) -> dict:
    """A case's sdpa inputs with q, k, v dequantized (float64) and the descale factors taken out; the same inputs
    when it passes none."""
    descales = descale_options(inputs)
    if not descales:
        return inputs
    plain = {name: value for name, value in inputs.items() if name not in DESCALES}
    plain["q"], plain["k"], plain["v"] = dequantize(inputs["q"], inputs["k"], inputs["v"], **descales)
    return plain

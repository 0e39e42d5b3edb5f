"""The float64 sdpa oracle and its allowed error, computed a block of query rows at a time.

``oracle.sdpa`` and ``tolerances.sdpa_allowed`` build whole (B, Hq, Lq, Lk) arrays:
at Lq = Lk = 16384 that is 2 GiB per array and per head, and they hold several.
This module gives the same numbers while holding only (B, Hq, block, Lk) at a time.

Why blocking by query rows is exact: every quantity of the spec is row-local.
Output row i is softmax(s_i) @ v, where s_i = scale * q_i @ k^T + bias_i needs only
query row i, all of k, and row i of the bias (the mask's row i and the causal band
j <= i, with i the *global* query index). The tolerance model is per row too
(spec/tolerances.yaml, section sdpa): V_i, sum_j p_ij ds_ij and the fully masked
test read row i alone. The only whole-matrix facts are per key or per head (the
largest |v| of each key, the mean of v): O(B * Hkv * Lk * Dv), computed once.
So computing rows block by block and stacking them gives the unblocked result,
up to the last bits of the matrix products (BLAS may sum in another order for
another shape).

Memory: the inputs are O(B * H * L * D). Each step holds a few arrays of
(B, Hq, block, Lk) elements; with block <= D that is at most B * Hq * Lk * D,
the size of k repeated to Hq heads, so peak memory stays O(L * D), never
O(Lq * Lk). Grouped-query heads are matched by stacking the query heads of each
kv head, so k and v are never repeated either. With is_causal, a block skips the
keys after its last row (their weights are exactly 0).

The formulas are the ones of ``oracle`` and ``tolerances._sdpa_terms`` /
``tolerances.sdpa_allowed``, written out per block; for float16 and bfloat16 the
per-element 16-bit model is ``tolerances.sdpa_allowed`` itself, called on each
block's query rows with the block's bias. tests/test_oracle_blocked.py checks that
both agree on many small shapes.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from attention_conformance.conformance.reference import oracle, tolerances
from attention_conformance.conformance.reference.output_forms import assemble

# 128 rows keep the Python overhead per step small next to the NumPy work, and
# every realistic head dimension is >= 64, so the O(L * D) bound holds within 2x.
DEFAULT_BLOCK = 128


@dataclass
class _Problem:
    """The widened inputs and what every block needs."""

    q: np.ndarray  # (B, Hq, Lq, Dk)
    k: np.ndarray  # (B, Hkv, Lk, Dk)
    v: np.ndarray  # (B, Hkv, Lk, Dv)
    mask: np.ndarray | None
    is_causal: bool
    scale: float

    @property
    def lq(self) -> int:
        return self.q.shape[-2]

    @property
    def lk(self) -> int:
        return self.k.shape[-2]

    @property
    def query_heads(self) -> int:
        return self.q.shape[1]

    @functools.cached_property
    def mean_v(self) -> np.ndarray:
        """(B, Hq, 1, Dv): what the 'uniform' policy gives a fully masked row."""
        return _per_query_head(np.mean(self.v, axis=-2, keepdims=True), self.query_heads)


def _problem(q, k, v, mask, is_causal, scale) -> _Problem:
    # Widening is exact; float64 inputs are used as they are (nothing here writes to them).
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if q.ndim != 4:
        raise ValueError(f"q must be (B, Hq, Lq, Dk); got shape {q.shape}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"Hq={q.shape[1]} is not a multiple of Hkv={k.shape[1]}")
    scale_value = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _Problem(q, k, v, None if mask is None else np.asarray(mask), bool(is_causal), scale_value)


def row_blocks(lq: int, block: int):
    """Consecutive query-row slices of at most ``block`` rows covering 0 .. lq-1."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    for start in range(0, lq, block):
        yield slice(start, min(start + block, lq))


def key_range(rows: slice, lk: int, is_causal: bool) -> slice:
    """The keys rows ``rows`` may attend at all: with is_causal, none beyond the block's last row.

    Left out, those keys would get weight exactly 0 and add nothing; leaving them
    out halves the work of a causal square.
    """
    return slice(0, min(lk, rows.stop) if is_causal else lk)


# ------------------------------------------------------- grouped-query heads
def _with_kv(a: np.ndarray, kv: np.ndarray) -> np.ndarray:
    """a (B, Hq, n, X) @ kv (B, Hkv, X, Y) -> (B, Hq, n, Y), query head h against kv head h // (Hq / Hkv).

    The G = Hq / Hkv query heads of one kv head are consecutive, so their rows stack
    into one (G * n, X) matrix: one large product per kv head rather than G small
    ones (several times faster in BLAS), and k and v are never repeated.
    """
    b, hq, n, x = a.shape
    hkv = kv.shape[1]
    stacked = a.reshape(b, hkv, (hq // hkv) * n, x)
    return (stacked @ kv).reshape(b, hq, n, kv.shape[-1])


def _per_query_head(x: np.ndarray, query_heads: int) -> np.ndarray:
    """(B, Hkv, ...) -> (B, Hq, ...) by repetition; only for per-key or per-head summaries (no Lq axis)."""
    return np.repeat(x, query_heads // x.shape[1], axis=1)


# ------------------------------------------------------------------- bias
def _mask_part(mask: np.ndarray, rows: slice, keys: slice) -> np.ndarray:
    """The mask at query rows ``rows`` and keys ``keys``; an axis of length 1 (or absent) broadcasts as is."""
    if mask.ndim >= 1 and mask.shape[-1] != 1:
        mask = mask[..., keys]
    if mask.ndim >= 2 and mask.shape[-2] != 1:
        mask = mask[..., rows, :]
    return mask


def block_bias(mask, is_causal: bool, rows: slice, keys: slice) -> np.ndarray:
    """``oracle.attention_bias`` at query rows ``rows`` and keys ``keys``; broadcasts to (..., rows, keys).

    The causal band compares global indices (rows.start ..., keys.start ...), not
    positions inside the block.
    """
    bias = np.zeros((rows.stop - rows.start, keys.stop - keys.start))
    if mask is not None:
        part = _mask_part(mask, rows, keys)
        if part.dtype == np.bool_:
            bias = np.where(part, 0.0, -np.inf)
        else:
            bias = bias + part.astype(np.float64)
    if is_causal:
        band = np.arange(keys.start, keys.stop)[None, :] <= np.arange(rows.start, rows.stop)[:, None]
        bias = np.where(band, bias, -np.inf)
    return bias


def _empty_rows(bias: np.ndarray, batch_heads: tuple[int, int], rows: slice) -> np.ndarray:
    """(B, Hq, n, 1) boolean: rows whose every key is masked (``oracle.fully_masked_rows``)."""
    empty = np.all(np.isneginf(bias), axis=-1, keepdims=True)
    return np.broadcast_to(empty, batch_heads + (rows.stop - rows.start, 1))


# ---------------------------------------------------------------- one block
@dataclass
class _Block:
    rows: slice
    keys: slice
    weights: np.ndarray  # (B, Hq, n, keys), the softmax; a fully masked row is all 0
    bias: np.ndarray  # broadcasts to (B, Hq, n, keys)
    empty: np.ndarray  # (B, Hq, n, 1)


def _block(p: _Problem, rows: slice) -> _Block:
    """Scores, bias and weights of query rows ``rows``, as ``oracle.attention_weights`` computes them.

    In place where it can be: each step then holds one (B, Hq, n, keys) array here.
    """
    keys = key_range(rows, p.lk, p.is_causal)
    bias = block_bias(p.mask, p.is_causal, rows, keys)
    s = _with_kv(p.q[:, :, rows], np.swapaxes(p.k[:, :, keys], -1, -2))
    s *= p.scale
    s += bias
    row_max = np.max(s, axis=-1, keepdims=True)
    fully_masked = np.isneginf(row_max)
    s -= np.where(fully_masked, 0.0, row_max)
    weights = np.exp(s, out=s)
    # A fully masked row is -inf throughout: its exponentials and their sum are 0, divided by 1.
    weights /= np.where(fully_masked, 1.0, np.sum(weights, axis=-1, keepdims=True))
    return _Block(rows, keys, weights, bias, _empty_rows(bias, p.q.shape[:2], rows))


def _block_output(p: _Problem, blk: _Block, policy: str) -> np.ndarray:
    """``oracle.sdpa`` for the block's rows under the fully-masked-rows policy."""
    out = _with_kv(blk.weights, p.v[:, :, blk.keys])
    if policy == "nan":
        out = np.where(blk.empty, np.nan, out)
    elif policy == "uniform":
        out = np.where(blk.empty, p.mean_v, out)
    return out


@dataclass
class _AllowedContext:
    """What the allowed error needs beyond the block: |k|, per-key and per-head maxima of |v|."""

    u: float
    abs_k_t: np.ndarray  # (B, Hkv, Dk, Lk)
    v_row_max: np.ndarray  # (B, Hq, 1, Lk): the largest |v_jd| of key j
    uniform: np.ndarray | None  # (B, Hq, 1, Dv): the 'uniform' policy's bound for a fully masked row; None under others


def _allowed_context(p: _Problem, dtype: str, policy: str = "zeros") -> _AllowedContext:
    abs_v = np.abs(p.v)
    u = tolerances.unit_roundoff(dtype)
    return _AllowedContext(
        u=u,
        abs_k_t=np.swapaxes(np.abs(p.k), -1, -2),
        v_row_max=_per_query_head(np.max(abs_v, axis=-1)[..., None, :], p.query_heads),
        uniform=tolerances.uniform_row_bound(u, p.v, p.query_heads) if policy == "uniform" else None,
    )


def _block_allowed(p: _Problem, blk: _Block, ctx: _AllowedContext, policy: str) -> np.ndarray:
    """``tolerances.sdpa_allowed`` for the block's rows, (B, Hq, n, 1), or (B, Hq, n, Dv) where some output element's
    summands coincide (tolerances.accumulation_growth).

    Keys outside ``blk.keys`` have weight 0 and so cost nothing in either term.
    """
    u, dk = ctx.u, p.q.shape[-1]
    # ds_ij = u * (sqrt(Dk) * |scale| * |q_i| . |k_j| + |m_ij|), m the finite part of the bias
    score_error = _with_kv(np.abs(p.q[:, :, blk.rows]), ctx.abs_k_t[..., blk.keys])
    score_error *= abs(p.scale) * u * math.sqrt(dk)
    score_error += u * np.where(np.isfinite(blk.bias), np.abs(blk.bias), 0.0)
    weighted_error = np.sum(np.multiply(blk.weights, score_error, out=score_error), axis=-1, keepdims=True)
    # tolerances._sdpa_terms also gives rows that attend nothing a V_i; sdpa_allowed then
    # overrides those rows (0, or the 'uniform' spread below), so it is not needed here.
    v_max = np.max(np.where(blk.weights > 0, ctx.v_row_max[..., blk.keys], 0.0), axis=-1, keepdims=True)
    growth = tolerances.accumulation_growth(blk.weights, p.v[:, :, blk.keys], p.lk, u)
    allowed = tolerances.sdpa_row_bound(u, v_max, weighted_error, growth)
    if policy == "uniform":
        return np.where(blk.empty, ctx.uniform, allowed)
    return np.where(blk.empty, 0.0, allowed)


def _block_allowed16(p: _Problem, rows: slice, dtype: str, policy: str, tf32: bool = False) -> np.ndarray:
    """``tolerances.sdpa_allowed`` for a 16-bit dtype (or float32 declared TF32, held to the 16-bit model) at the
    block's rows, (B, Hq, n, Dv).

    The 16-bit model (spec/tolerances.yaml, sixteen_bit) is per output element but still row-local:
    it is evaluated on the block's query rows against all keys, with the block's rows of the bias
    (mask and causal band at the global row indices) passed as an additive float mask. It holds a
    few (B, Hq, n, Lk) arrays and k, v repeated to Hq heads: O(block * Lk + L * D) per step.
    """
    bias = block_bias(p.mask, p.is_causal, rows, slice(0, p.lk))
    return tolerances.sdpa_allowed(p.q[:, :, rows], p.k, p.v, bias, False, p.scale, dtype, policy, tf32=tf32)


# ------------------------------------------------------------------ public
def sdpa(q, k, v, mask=None, is_causal=False, scale=None, fully_masked_rows_policy: str = "zeros",
         block: int = DEFAULT_BLOCK) -> np.ndarray:
    """``oracle.sdpa``, block by block: (B, Hq, Lq, Dv) float64."""
    p = _problem(q, k, v, mask, is_causal, scale)
    out = np.empty(p.q.shape[:-1] + (p.v.shape[-1],))
    for rows in row_blocks(p.lq, block):
        out[:, :, rows] = _block_output(p, _block(p, rows), fully_masked_rows_policy)
    return out


def sdpa_with_allowed(q, k, v, mask=None, is_causal=False, scale=None, dtype: str = "float32",
                      policy: str = "zeros", block: int = DEFAULT_BLOCK,
                      tf32: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(``oracle.sdpa``, ``tolerances.sdpa_allowed``) in one blocked pass.

    expected and allowed are (B, Hq, Lq, Dv): the first-order model's bound is per row but for the
    elements whose summands coincide (tolerances.accumulation_growth), the 16-bit model's per element
    (spec/tolerances.yaml, sixteen_bit). ``dtype`` names the dtype under test (its unit
    roundoff sets the bound); ``policy`` is the fully-masked-rows policy; ``tf32``
    declares TF32 float32 matmuls.
    """
    p = _problem(q, k, v, mask, is_causal, scale)
    per_element = tolerances.is_sixteen_bit(dtype) or tf32  # TF32 takes the 16-bit model (spec/tolerances.yaml, tf32)
    ctx = None if per_element else _allowed_context(p, dtype, policy)
    expected = np.empty(p.q.shape[:-1] + (p.v.shape[-1],))
    allowed = np.empty(p.q.shape[:-1] + (p.v.shape[-1],))
    for rows in row_blocks(p.lq, block):
        blk = _block(p, rows)
        expected[:, :, rows] = _block_output(p, blk, policy)
        if per_element:
            allowed[:, :, rows] = _block_allowed16(p, rows, dtype, policy, tf32)
        else:
            allowed[:, :, rows] = _block_allowed(p, blk, ctx, policy)
    return expected, allowed


def fully_masked_rows(q, k, mask=None, is_causal=False, block: int = DEFAULT_BLOCK) -> np.ndarray:
    """``oracle.fully_masked_rows``, block by block: (B, Hq, Lq) boolean."""
    batch_heads, lq, lk = tuple(np.shape(q)[:2]), np.shape(q)[-2], np.shape(k)[-2]
    mask = None if mask is None else np.asarray(mask)
    empty = np.empty(batch_heads + (lq,), dtype=bool)
    for rows in row_blocks(lq, block):
        bias = block_bias(mask, is_causal, rows, key_range(rows, lk, is_causal))
        empty[:, :, rows] = _empty_rows(bias, batch_heads, rows)[..., 0]
    return empty


# ------------------------------------------- variants, packed and paged batches
# Every variant of the contract is row-local too: query row i sits at position query_offset + i for the causal band,
# the window, ALiBi and the chunk; the key-side variants (key_lengths, key_leftpad, sink tokens, the learnable sink,
# softcap) do not look at the row at all. So a block of rows is the same case with q's and the mask's rows cut out
# and query_offset moved by the block's first row, judged by the unblocked oracle and tolerance model themselves
# (each step holds a few (B, Hq, block, Lk) arrays). A packed or paged batch is its sequences' sdpa cases
# (oracle.sequence_cases), each blocked the same way.
ARRAY_ARGUMENTS = ("q", "k", "v", "mask", "is_causal", "scale")


def rows_of(case: dict, rows: slice) -> dict:
    """An sdpa case (oracle.sdpa's arguments by name, variants included) cut to query rows ``rows``: q's rows and the
    mask's (an axis of length 1 broadcasts as is), query_offset moved by rows.start, query_lengths counted from it;
    the key side whole."""
    part = dict(case, q=case["q"][:, :, rows])
    mask = case.get("mask")
    if mask is not None and np.ndim(mask) >= 2 and np.shape(mask)[-2] != 1:
        part["mask"] = np.asarray(mask)[..., rows, :]
    part["query_offset"] = int(case.get("query_offset") or 0) + rows.start
    if case.get("query_lengths") is not None:
        part["query_lengths"] = np.clip(np.asarray(case["query_lengths"]) - rows.start, 0, rows.stop - rows.start)
    return part


def _split(case: dict) -> tuple[list, dict]:
    options = dict(case)
    return [options.pop(name, None) for name in ARRAY_ARGUMENTS], options


def case_with_allowed(case: dict, dtype: str, policy: str = "zeros", tf32: bool = False,
                      block: int = DEFAULT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(``oracle.sdpa``, ``tolerances.sdpa_allowed`` broadcast to it) of an sdpa case with any of the contract's
    variants, ``block`` query rows at a time. ``case``: float64 arrays by the contract's names (8-bit cases are not
    blocked: dequantize first)."""
    (q, k, v, *_), _ = _split(case)
    expected = np.empty(q.shape[:-1] + (v.shape[-1],))
    allowed = np.empty_like(expected)
    for rows in row_blocks(q.shape[2], block):
        (bq, bk, bv, mask, is_causal, scale), options = _split(rows_of(case, rows))
        is_causal = bool(is_causal)
        att = oracle.attention(bq, bk, bv, mask, is_causal, scale, **options)
        expected[:, :, rows] = att.output(policy)
        allowed[:, :, rows] = tolerances.attention_allowed(att, dtype, policy, tf32)
    return expected, allowed


def case_fully_masked_rows(case: dict, block: int = DEFAULT_BLOCK) -> np.ndarray:
    """``oracle.fully_masked_rows`` of an sdpa case with variants, block by block: (B, Hq, Lq) boolean."""
    q = case["q"]
    empty = np.empty(q.shape[:3], dtype=bool)
    for rows in row_blocks(q.shape[2], block):
        (bq, bk, _, mask, is_causal, _), options = _split(rows_of(case, rows))
        options = {n: x for n, x in options.items() if n not in ("softcap", "alibi_slopes", "query_lengths")}
        empty[:, :, rows] = oracle.fully_masked_rows(bq, bk, mask, bool(is_causal), **options)
    return empty


def sequences_with_allowed(op: str, inputs: dict, dtype: str, policy: str = "zeros", tf32: bool = False,
                           alignment: str = "bottom-right", block: int = DEFAULT_BLOCK) -> tuple[np.ndarray, ...]:
    """(expected, allowed, fully masked rows) of an sdpa_varlen or sdpa_paged case in the judge's form
    (expected.assemble): each sequence's sdpa case blocked as ``case_with_allowed``. ``inputs``: float64."""
    wants, alloweds, empties = [], [], []
    for one in oracle.sequence_cases(op, inputs, alignment):
        shape = one["q"].shape[:3] + (one["v"].shape[3],)
        if shape[2] == 0:
            want = allowed = np.zeros(shape)
            empty = np.zeros(shape[:3], dtype=bool)
        else:
            want, allowed = case_with_allowed(one, dtype, policy, tf32, block)
            empty = case_fully_masked_rows(one, block)
        wants.append(want)
        alloweds.append(allowed)
        empties.append(empty)
    return assemble(op, wants), assemble(op, alloweds), assemble(op, empties)

"""Every Hypothesis strategy of the suite, in one place.

Draws are labelled and sizes capped (MAX_* below) so each example stays cheap and a
failure shrinks to a small, readable case. Array values come from a drawn seed
(NumPy's generator): shrinking then works on shapes, masks and flags, which is
where attention bugs live, and a repro prints the values literally.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from . import oracle
from .cases import Case

MAX_BATCH = 2
MAX_KV_HEADS = 2
MAX_GROUP = 3  # Hq / Hkv
MAX_LEN = 7
MAX_DIM = 6
# Standard deviation of q and k entries; scores then have std about SIGMA**2
# (default scale), so 32 gives scores around 1e3, where exp overflows unless the
# implementation subtracts the row maximum.
SCORE_SIGMAS = {"unit": 1.0, "moderate": 4.0, "large": 32.0}
MASK_KINDS = ("none", "bool-full", "bool-2d", "key-padding", "per-head", "bool-query-keys", "float", "float-large")
# Lengths and head widths one short of, at and one past the tile sizes blocked kernels use
# (flash-attention's own tests sweep such pairs: seqlens (113, 203), (1023, 1024), widths 59, 111):
# a partial last tile that is dropped, read twice or masked wrongly shows only here, since
# every other generated length stays below 8.
TILE_SIZES = (8, 16, 32, 64, 128)
TILE_EDGE_LENGTHS = st.sampled_from(sorted({t + d for t in TILE_SIZES for d in (-1, 0, 1)})) | st.integers(1, 130)
TILE_EDGE_DIMS = st.sampled_from([7, 8, 9, 15, 16, 17, 31, 33]) | st.integers(1, MAX_DIM)
SCALES = st.one_of(
    st.none(),
    st.sampled_from([0.0, 1.0, -1.0, 0.125, -0.35, 2.5]),
    st.floats(-3, 3, allow_nan=False, allow_infinity=False, width=32),
)


def mask_shape(kind: str, b: int, hq: int, lq: int, lk: int) -> tuple[int, ...]:
    return {
        "bool-full": (b, hq, lq, lk),
        "float": (b, hq, lq, lk),
        "float-large": (b, 1, lq, lk),
        "bool-2d": (lq, lk),
        "key-padding": (b, 1, 1, lk),
        "per-head": (1, hq, lq, lk),
        "bool-query-keys": (b, 1, lq, lk),
    }[kind]


def _build_mask(rng, kind, shape, lq, lk, is_causal, allow_empty_rows):
    """A mask of the given kind; unless empty rows are allowed, every row keeps one attendable key."""
    keep = rng.random(shape) < 0.6
    if not allow_empty_rows:
        # One guaranteed key per row of the mask (broadcast rows included), inside the causal band if causal.
        rows = np.arange(shape[-2])
        limit = np.minimum(rows, lk - 1) if (is_causal and shape[-2] == lq) else np.full(shape[-2], lk - 1)
        if is_causal and shape[-2] == 1:
            limit = np.zeros(1, dtype=int)  # a key-padding row is shared by every query, query 0 included
        chosen = (rng.random(shape[:-1]) * (limit + 1)).astype(int)
        np.put_along_axis(keep, chosen[..., None], True, axis=-1)
    if kind.startswith("float"):
        values = rng.standard_normal(shape) * (1.0 if kind == "float" else 0.5)
        fill = -np.inf if kind == "float" else rng.choice([-1e9, -1e4, -3e2])
        return np.where(keep, values, fill)
    return keep


@st.composite
def sdpa_cases(
    draw,
    *,
    mask_kinds=MASK_KINDS,
    causal=st.booleans(),
    scale=SCALES,
    gqa: bool = True,
    same_dims: bool = False,
    same_lengths: bool = False,
    sigmas=tuple(SCORE_SIGMAS),
    allow_empty_rows: bool = False,
    clauses=("sdpa.definition",),
    bottom_right_mask: bool = False,
    lengths=st.integers(1, MAX_LEN),
    dims=st.integers(1, MAX_DIM),
    kv_heads=st.integers(1, MAX_KV_HEADS),
    groups=st.integers(1, MAX_GROUP),
) -> Case:
    b = draw(st.integers(1, MAX_BATCH), label="B")
    hkv = draw(kv_heads, label="Hkv")
    hq = hkv * (draw(groups, label="Hq/Hkv") if gqa else 1)
    lq = draw(lengths, label="Lq")
    lk = lq if same_lengths else draw(lengths, label="Lk")
    dk = draw(dims, label="Dk")
    # Half the cases keep Dv == Dk, which many kernels require.
    dv = dk if same_dims or draw(st.booleans(), label="Dv == Dk") else draw(dims, label="Dv")
    is_causal = draw(causal, label="is_causal")
    kind = draw(st.sampled_from(mask_kinds), label="mask")
    sigma_name = draw(st.sampled_from(sigmas), label="score magnitude")
    chosen_scale = draw(scale, label="scale")
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    sigma = SCORE_SIGMAS[sigma_name]
    inputs = {
        "q": rng.standard_normal((b, hq, lq, dk)) * sigma,
        "k": rng.standard_normal((b, hkv, lk, dk)) * sigma,
        "v": rng.standard_normal((b, hkv, lk, dv)),
    }
    if kind != "none":
        inputs["mask"] = _build_mask(rng, kind, mask_shape(kind, b, hq, lq, lk), lq, lk, is_causal, allow_empty_rows)
    if bottom_right_mask:
        inputs["mask"] = oracle.causal_allowed(lq, lk, bottom_right=True)
        kind = "bottom-right"
    if is_causal:
        inputs["is_causal"] = True
    if chosen_scale is not None:
        inputs["scale"] = float(chosen_scale)
    label = (
        f"B{b} Hq{hq}/Hkv{hkv} Lq{lq} Lk{lk} Dk{dk} Dv{dv} mask={kind}{' causal' if is_causal else ''}"
        f" scale={chosen_scale} scores~{sigma_name} seed={seed}"
    )
    return Case("sdpa", inputs, tuple(clauses), label, mask_kind=kind)


@st.composite
def softmax_cases(draw, *, clauses=("softmax.definition",), sigmas=tuple(SCORE_SIGMAS), neg_inf: bool = False,
                  axis=st.sampled_from([-1, -2, 0, 1])) -> Case:
    ndim = draw(st.integers(1, 3), label="ndim")
    shape = tuple(draw(st.lists(st.integers(1, MAX_LEN), min_size=ndim, max_size=ndim), label="shape"))
    chosen_axis = draw(axis, label="axis")
    if not -ndim <= chosen_axis < ndim:
        chosen_axis = -1
    sigma = SCORE_SIGMAS[draw(st.sampled_from(sigmas), label="magnitude")] ** 2
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * sigma
    if neg_inf:
        hole = rng.random(shape) < 0.4
        keep = np.argmax(rng.random(shape), axis=chosen_axis)  # one finite entry per slice
        np.put_along_axis(hole, np.expand_dims(keep, chosen_axis), False, axis=chosen_axis)
        x = np.where(hole, -np.inf, x)
    inputs = {"x": x}
    if chosen_axis != -1:
        inputs["axis"] = chosen_axis
    label = f"shape{shape} axis={chosen_axis} magnitude={sigma:g}{' with -inf' if neg_inf else ''} seed={seed}"
    return Case("softmax", inputs, tuple(clauses), label)


BIAS_KINDS = ("none", "input", "output", "all")


@st.composite
def mha_cases(draw, *, clauses=("mha.projections",), bias=st.sampled_from(BIAS_KINDS), cross=st.booleans(),
              mask_kinds=("none", "bool-2d", "key-padding", "float"), causal=st.booleans(),
              min_heads: int = 1, min_len: int = 1, head_width_free: bool = False,
              allow_empty_rows: bool = False) -> Case:
    b = draw(st.integers(1, MAX_BATCH), label="B")
    h = draw(st.integers(min_heads, 3), label="H")
    lq = draw(st.integers(min_len, MAX_LEN), label="Lq")
    is_cross = draw(cross, label="cross-attention")
    lk = draw(st.integers(1, MAX_LEN), label="Lk") if is_cross else lq
    # Half the cases use the common layout (head width E / H for q, k and v, as in
    # nn.MultiheadAttention), so an implementation limited to it is not starved of cases.
    standard = not head_width_free and draw(st.booleans(), label="head width E / H")
    if standard:
        dk = dv = draw(st.integers(1, 3), label="head D")
        e = h * dk
        e_kv = draw(st.sampled_from([e, e + 1]), label="E_kv") if is_cross else e
    else:
        e = draw(st.integers(1, 8), label="E")
        e_kv = draw(st.integers(1, 8), label="E_kv") if is_cross else e
        dk = draw(st.integers(1, 4), label="head Dk")
        dv = draw(st.integers(1, 4), label="head Dv")
    if head_width_free and h * dk == e:
        e += 1  # keep the head width away from E / H
        e_kv = e_kv if is_cross else e
    with_bias = draw(bias, label="bias")  # which projections carry a bias
    is_causal = draw(causal, label="is_causal")
    kind = draw(st.sampled_from(mask_kinds), label="mask")
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, lq, e))
    kv = rng.standard_normal((b, lk, e_kv)) if is_cross else x
    params = {
        "w_q": rng.standard_normal((e, h * dk)) / np.sqrt(e),
        "w_k": rng.standard_normal((e_kv, h * dk)) / np.sqrt(e_kv),
        "w_v": rng.standard_normal((e_kv, h * dv)) / np.sqrt(e_kv),
        "w_o": rng.standard_normal((h * dv, e)) / np.sqrt(h * dv),
    }
    biased = {"none": "", "input": "qkv", "output": "o", "all": "qkvo"}[with_bias]
    params.update({f"b_{n}": rng.standard_normal(params[f"w_{n}"].shape[1]) for n in biased})
    inputs = {"query": x, "key": kv, "value": kv, "params": params, "num_heads": h}
    if kind != "none":
        inputs["mask"] = _build_mask(rng, kind, mask_shape(kind, b, h, lq, lk), lq, lk, is_causal, allow_empty_rows)
    if is_causal:
        inputs["is_causal"] = True
    label = (f"B{b} H{h} Lq{lq} Lk{lk} E{e} E_kv{e_kv} Dk{dk} Dv{dv} bias={with_bias} mask={kind}"
             f"{' causal' if is_causal else ''} seed={seed}")
    return Case("multi_head_attention", inputs, tuple(clauses), label, mask_kind=kind)

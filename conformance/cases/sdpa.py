"""Hypothesis strategies of sdpa: shapes (small or kernel-shaped), masks of every kind and broadcast, the causal
flag, scales of both signs, score magnitudes, GQA groups, and the float16 outlier channel past its range.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import CannotBuild, admits, hint, hinted
from attention_conformance.conformance.cases.drawing import (
    inside_range,
    draw_is_causal,
    draw_mask_kind,
    active_region,
    build_mask,
    equal_lengths,
    hinted_lengths,
    keep_inside,
    kernel_lengths,
    lengths_in_order,
    mask_class,
    mask_shape,
    outside_region,
    scales_inside,
    signature_takes,
    small_shapes_inside,
    without_keyword,
)
from attention_conformance.conformance.cases.limits import (
    DECODE_CORNER_MAX_DK,
    DECODE_CORNER_PAST,
    KERNEL_GROUPS,
    KERNEL_HEAD_DIMS,
    KERNEL_SCORE_BUDGET,
    KERNEL_SHARE,
    MASK_KINDS,
    MAX_BATCH,
    MAX_DIM,
    MAX_GROUP,
    MAX_KV_HEADS,
    MAX_LEN,
    SCALES,
    SCORE_SIGMAS,
)
from attention_conformance.conformance.reference import oracle


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
    lengths=None,
    dims=None,
    kv_heads=None,
    groups=None,
    query_mode: str | None = None,
    outermost: bool = True,
) -> Case:
    """An sdpa case inside the active region (drawing_inside): small shapes, or kernel-shaped ones.

    ``lengths``, ``dims``, ``kv_heads`` and ``groups`` override the shape draws of a
    property (None: the mode's own); a kernel-shaped case keeps the property's lengths,
    heads and groups where the region allows them, and its head dims where the region takes
    the small shapes (else it draws them from the region's kernel head dims).
    ``query_mode`` ("decode", "prefill", "cross") makes every case kernel-shaped in that mode.
    ``outermost``: False where another strategy builds on the case (variant_cases), which then asks the region.
    """
    region = active_region()
    scale = scales_inside(without_keyword(scale, "scale", None), region)
    causal = without_keyword(causal, "is_causal", False)
    kinds = [k for k in mask_kinds if mask_class(k) in region.masks and (k == "none" or signature_takes("mask"))]
    if bottom_right_mask and "bool" not in region.masks:
        kinds = []
    if not kinds and not signature_takes("mask") and any(k != "none" for k in mask_kinds):
        outside_region("the property passes a mask, which the signature lacks")
    if not kinds:
        needed = {"bool"} if bottom_right_mask else {mask_class(k) for k in mask_kinds}
        outside_region(f"the property needs a {'/'.join(sorted(needed))} mask "
                        f"(declared masks: {', '.join(region.masks)})")
    # A covering corner (conformance/cases/covering.py) hints its structure; a hint the property's own strategy does not
    # admit is not taken. Random draws see no hints.
    kernel = query_mode is not None or not small_shapes_inside(region) or (
        hint("kernel") if hint("kernel") is not None
        else draw(st.integers(0, KERNEL_SHARE - 1), label="kernel-shaped") == 0)
    b = draw(st.integers(1, MAX_BATCH), label="B") if hint("B") is None else hint("B")
    if kv_heads is None:
        kv_heads = st.sampled_from((1, 2)) if kernel else st.integers(1, MAX_KV_HEADS)
    hkv = hint("Hkv") if hint("Hkv") is not None and admits(kv_heads, hint("Hkv")) else draw(kv_heads, label="Hkv")
    group = 1
    if gqa:
        groups = (st.sampled_from(KERNEL_GROUPS) if kernel else st.integers(1, MAX_GROUP)) if groups is None else groups
        wanted = hint("group")
        group = wanted if wanted is not None and admits(groups, wanted) else draw(groups, label="Hq/Hkv")
    if group > 1 and (not region.gqa or (region.max_group is not None and group > region.max_group)):
        if groups is not None:  # the property is about this group size
            outside_region(f"Hq/Hkv = {group} (declared gqa: {region.gqa}, max_group: {region.max_group})")
        group = 1 if not region.gqa else min(group, region.max_group)
    hq = hkv * group
    is_causal = draw_is_causal(draw, causal, region)
    if is_causal and not region.causal:
        outside_region("is_causal=True (declared causal: False)")
    if hint("causal_only") and not is_causal:
        raise CannotBuild("a corner about the causal band, in a property that holds is_causal off")
    same_lengths = same_lengths or equal_lengths(region, is_causal)
    if same_lengths and query_mode == "decode":
        outside_region("a decode case (Lq < Lk) where the region takes Lq == Lk only")
    corner_lengths = hinted_lengths(region, b * hq, same_lengths, lengths, query_mode, is_causal)
    if corner_lengths:
        lq, lk = corner_lengths
    if kernel:
        if not corner_lengths:
            lq, lk = kernel_lengths(draw, region, KERNEL_SCORE_BUDGET // (b * hq), same_lengths, lengths, is_causal,
                                     query_mode)
        if dims is not None and small_shapes_inside(region):  # the property's own widths (tile edges) fit
            dims = inside_range(dims, region.head_dims)
        else:
            dims = st.sampled_from(region.head_dims.members(KERNEL_HEAD_DIMS) or [region.head_dims.min])
    else:
        lengths = st.integers(1, MAX_LEN) if lengths is None else lengths
        if not corner_lengths:
            lq = draw(lengths, label="Lq")
            lk = lq if same_lengths else draw(lengths, label="Lk")
        dims = inside_range(st.integers(1, MAX_DIM) if dims is None else dims, region.head_dims)
    lq, lk = lengths_in_order(lq, lk, region, is_causal)
    if corner_lengths and lk > DECODE_CORNER_PAST:
        narrow = region.head_dims.members(tuple(d for d in KERNEL_HEAD_DIMS if d <= DECODE_CORNER_MAX_DK))
        dims = st.sampled_from(narrow) if narrow else dims
    dk = hint("Dk") if hint("Dk") is not None and admits(dims, hint("Dk")) else draw(dims, label="Dk")
    # Half the cases keep Dv == Dk, which many kernels require.
    wanted_dv = hint("Dv")
    if same_dims or region.same_value_dim or (wanted_dv == dk if wanted_dv is not None
                                               else draw(st.booleans(), label="Dv == Dk")):
        dv = dk
    else:
        dv = wanted_dv if wanted_dv is not None and admits(dims, wanted_dv) else draw(dims, label="Dv")
    kind = draw_mask_kind(draw, kinds)
    magnitudes = st.sampled_from(sigmas)
    sigma_name = hint("magnitude") if admits(magnitudes, hint("magnitude")) else draw(magnitudes,
                                                                                      label="score magnitude")
    chosen_scale = hint("scale") if hinted("scale") and admits(scale, hint("scale")) else draw(scale, label="scale")
    if outermost:  # the facts are known before any value is drawn: a refused draw costs no arrays
        keep_inside(draw, {"op": "sdpa", "B": b, "Hq": hq, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": dk, "Dv": dv,
                            "is_causal": bool(is_causal), "scale": chosen_scale, "variants": (), "variant_values": {},
                            "query_offset_is_bottom_right": lq == lk,
                            "mask_kind": "bool" if bottom_right_mask else mask_class(kind)})
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    # Raw dot products grow like sqrt(Dk): past the small dims, q and k shrink by (MAX_DIM / Dk)^(1/4) so an explicit
    # scale keeps scores in the magnitude class drawn (16-bit scores of a large class near 1e4, not past float16's
    # 65504, which is a range limit of the dtype rather than of the attention).
    sigma = SCORE_SIGMAS[sigma_name] * min(1.0, (MAX_DIM / dk) ** 0.25)
    inputs = {
        "q": rng.standard_normal((b, hq, lq, dk)) * sigma,
        "k": rng.standard_normal((b, hkv, lk, dk)) * sigma,
        "v": rng.standard_normal((b, hkv, lk, dv)),
    }
    if kind != "none":
        inputs["mask"] = build_mask(rng, kind, mask_shape(kind, b, hq, lq, lk), lq, lk, is_causal, allow_empty_rows)
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


# ------------------------------------------------------------------ outlier channels
# Activations with an outlier feature (LLM.int8(), Dettmers et al. 2022; "massive activations", Sun et al. 2024): one
# channel of q and of k hundreds of times the others. The unscaled product q.k then passes float16's largest value
# (65504) while scale * q.k stays inside it: an implementation that rounds q @ k^T to float16 before the scale gets
# inf, then NaN (Hugging Face's eager attention computes q @ k^T, then * scaling); one that scales q first, or scales
# in its float32 accumulator, stays finite. Only float16's range is so narrow: in bfloat16 and float32, whose range
# is float32's, the scaled score would overflow too.
OUTLIER_UNSCALED_SCORE = 1.5 * 65504.0  # the largest |q.k| of a case: the outlier channel's product


OUTLIER_HEAD_DIMS = (16, 32, 64, 128)  # scale 1/sqrt(Dk) <= 1/4: |scale q.k| <= 2.5e4, inside float16's range


# A kernel-shaped case takes its region's kernel head dims instead (cuDNN's include 8: |scale q.k| <= 3.5e4, a row's
# scores spanning 6.9e4, which found torch's cuDNN holding removed keys at a finite fill; docs/gpu.md). Below Dk 4 the
# product shrinks so that |scale q.k| stays at most OUTLIER_SCALED_SCORE: a case float16 cannot hold is no case.
OUTLIER_SCALED_SCORE = 0.75 * 65504.0


@st.composite
def outlier_channel_cases(draw, *, clauses=("sdpa.score-range", "sdpa.finite")) -> Case:
    """An sdpa case (default scale, no mask or key padding) whose q and k carry one outlier channel: q's is
    sqrt(OUTLIER_UNSCALED_SCORE) in every row, k's that times +-1 per key."""
    case = draw(sdpa_cases(mask_kinds=("none", "key-padding"), scale=st.none(), dims=st.sampled_from(OUTLIER_HEAD_DIMS),
                           same_dims=True, clauses=clauses), label="base case")
    inputs = dict(case.inputs)
    q, k = inputs["q"].copy(), inputs["k"].copy()
    channel = draw(st.integers(0, q.shape[-1] - 1), label="outlier channel")
    signs = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="signs seed")).choice([-1.0, 1.0],
                                                                                              size=k.shape[:-1])
    product = min(OUTLIER_UNSCALED_SCORE, OUTLIER_SCALED_SCORE * math.sqrt(q.shape[-1]))
    size = math.sqrt(product)
    q[..., channel], k[..., channel] = size, size * signs
    inputs.update(q=q, k=k)
    return Case("sdpa", inputs, case.clauses, f"{case.label} outlier channel {channel} (|q.k| up to "
                f"{product:.3g})", mask_kind=case.mask_kind)

"""Hypothesis strategies of multi_head_attention: projections, head splits, cross attention, masks, the causal flag,
and the variant keywords applied per head (mha.variants).
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import admits, hint
from attention_conformance.conformance.cases.drawing import (
    draw_is_causal,
    draw_mask_kind,
    active_region,
    build_mask,
    keep_inside,
    lengths_in_order,
    mask_class,
    mask_shape,
    outside_region,
    runs_variant,
    small_shapes_inside,
)
from attention_conformance.conformance.cases.limits import (
    KERNEL_EDGE_LENGTHS,
    KERNEL_SMALL_LENGTHS,
    MAX_BATCH,
    MAX_LEN,
)
from attention_conformance.conformance.cases.softmax import BIAS_KINDS
from attention_conformance.conformance.cases.variants import (
    SINK_FEATURES,
    VARIANTS,
    draw_sink_chunk_leftpad,
    draw_variant_keywords,
)
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.region import shape_facts


@st.composite
def mha_cases(draw, *, clauses=("mha.projections",), bias=st.sampled_from(BIAS_KINDS), cross=st.booleans(),
              mask_kinds=("none", "bool-2d", "key-padding", "float"), causal=st.booleans(),
              min_heads: int = 1, min_len: int = 1, head_width_free: bool = False,
              allow_empty_rows: bool = False) -> Case:
    region = active_region()
    kinds = [k for k in mask_kinds if mask_class(k) in region.masks]
    if not kinds:
        outside_region(f"the property needs a mask (declared masks: {', '.join(region.masks)})")
    # The per-head attention inside must lie in the region: kernel-shaped head widths where small ones are outside.
    kernel = not small_shapes_inside(region)
    # A covering corner's batch, lengths, causal band and mask are taken where the property admits them (without
    # them every MHA corner was Hypothesis's simplest case: batch 1, one query, one key, the first mask kind).
    b = hint("B") if hint("B") is not None else draw(st.integers(1, MAX_BATCH), label="B")
    h = draw(st.integers(min_heads, 3), label="H")
    length_choices = region.lengths.members(range(max(min_len, 1), MAX_LEN + 1)) or region.lengths.members(
        KERNEL_SMALL_LENGTHS + KERNEL_EDGE_LENGTHS)[:1] or [region.lengths.min]
    corner = hint("lengths") if hint("lengths") is not None and set(hint("lengths")) <= set(length_choices) else None
    if corner is not None:  # two lengths are a cross-attention case where the property admits one
        lq, wants_cross = corner[0], corner[0] != corner[1] and not region.equal_lengths
        is_cross = wants_cross if admits(cross, wants_cross) else not wants_cross
        lk = corner[1] if is_cross and not region.equal_lengths else lq
    else:
        lq = draw(st.sampled_from(length_choices), label="Lq")
        is_cross = draw(cross, label="cross-attention")
        lk = draw(st.sampled_from(length_choices), label="Lk") if is_cross and not region.equal_lengths else lq
    if head_width_free and region.mha_head_width_e_over_h:
        outside_region("a head width other than E / H (declared mha_head_width: 'e_over_h')")
    if kernel:
        dk = dv = draw(st.sampled_from(region.head_dims.members((16, 32, 64, 24, 48, 8, 128)) or [region.head_dims.min]),
                       label="head D")
        e = h * dk + (1 if head_width_free else 0)
        e_kv = draw(st.sampled_from([e, e + 1]), label="E_kv") if is_cross else e
    # Half the cases use the common layout (head width E / H for q, k and v, as in
    # nn.MultiheadAttention), so an implementation limited to it is not starved of cases.
    elif not head_width_free and (region.mha_head_width_e_over_h or draw(st.booleans(), label="head width E / H")):
        dk = dv = draw(st.integers(1, 3), label="head D")
        e = h * dk
        e_kv = draw(st.sampled_from([e, e + 1]), label="E_kv") if is_cross else e
    else:
        e = draw(st.integers(1, 8), label="E")
        e_kv = draw(st.integers(1, 8), label="E_kv") if is_cross else e
        dk = draw(st.integers(1, 4), label="head Dk")
        dv = dk if region.same_value_dim else draw(st.integers(1, 4), label="head Dv")
    if head_width_free and h * dk == e:
        e += 1  # keep the head width away from E / H
        e_kv = e_kv if is_cross else e
    with_bias = draw(bias, label="bias")  # which projections carry a bias
    is_causal = draw_is_causal(draw, causal, region)
    if is_causal and not region.causal:
        outside_region("is_causal=True (declared causal: False)")
    lq, lk = lengths_in_order(lq, lk, region, is_causal)
    kind = draw_mask_kind(draw, kinds)
    keep_inside(draw, {"op": "multi_head_attention", "B": b, "Hq": h, "Hkv": h, "Lq": lq, "Lk": lk, "Dk": dk,
                        "Dv": dv, "E": e, "E_k": e_kv, "E_v": e_kv, "E_out": e, "is_causal": bool(is_causal),
                        "mask_kind": mask_class(kind)})
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, lq, e))
    kv = rng.standard_normal((b, lk, e_kv)) if is_cross else x
    # value is its own tensor in every cross-attention case and in half the others, so projecting value from the
    # key input fails; the other half keeps value = key = query for implementations that only do self-attention.
    value = rng.standard_normal(kv.shape) if is_cross or draw(st.booleans(), label="value distinct") else kv
    params = {
        "w_q": rng.standard_normal((e, h * dk)) / np.sqrt(e),
        "w_k": rng.standard_normal((e_kv, h * dk)) / np.sqrt(e_kv),
        "w_v": rng.standard_normal((e_kv, h * dv)) / np.sqrt(e_kv),
        "w_o": rng.standard_normal((h * dv, e)) / np.sqrt(h * dv),
    }
    biased = {"none": "", "input": "qkv", "output": "o", "all": "qkvo"}[with_bias]
    params.update({f"b_{n}": rng.standard_normal(params[f"w_{n}"].shape[1]) for n in biased})
    inputs = {"query": x, "key": kv, "value": value, "params": params, "num_heads": h}
    if kind != "none":
        inputs["mask"] = build_mask(rng, kind, mask_shape(kind, b, h, lq, lk), lq, lk, is_causal, allow_empty_rows)
    if is_causal:
        inputs["is_causal"] = True
    label = (f"B{b} H{h} Lq{lq} Lk{lk} E{e} E_kv{e_kv} Dk{dk} Dv{dv} bias={with_bias} mask={kind}"
             f"{' causal' if is_causal else ''} seed={seed}")
    return Case("multi_head_attention", inputs, tuple(clauses), label, mask_kind=kind)


# ------------------------------------------------------------------ multi_head_attention with variants
# mha.variants: sdpa's variant keywords applied to each head's attention after the projections (Hq = Hkv =
# num_heads). A case of mha_cases with some of them, drawn at sdpa's edges (draw_variant_keywords,
# draw_sink_chunk_leftpad) on the per-head q and k its projections give, so that softcaps and sink logits are placed
# against those heads' own scores.
MHA_VARIANTS = VARIANTS + SINK_FEATURES



@st.composite
def mha_variant_cases(draw, *, variants=MHA_VARIANTS, required=None, clauses=("mha.variants",),
                      mask_kinds=("none", "key-padding", "float"), causal=st.booleans(), min_heads: int = 1,
                      all_of: bool = False) -> Case:
    """A multi_head_attention case using some of ``variants`` (names of VARIANTS and SINK_FEATURES): each the
    implementation runs (its multi_head_attention signature and its region) drawn with probability 1/2, at least one
    of ``required`` (default: of ``variants``), or every one with ``all_of``. Rows may be left without keys, as in
    variant_cases."""
    runnable = [name for name in variants if runs_variant(name)]
    needed = [name for name in runnable if required is None or name in required]
    if not needed:
        outside_region(f"multi_head_attention takes none of the variant keywords {', '.join(required or variants)}")
    # all_of: every one of them (a pairwise corner, conformance/cases/pairwise.py)
    chosen = runnable if all_of else [name for name in runnable if draw(st.booleans(), label=f"uses {name}")]
    if not set(chosen) & set(needed):
        chosen.append(draw(st.sampled_from(needed), label="the variant"))
    case = draw(mha_cases(clauses=clauses, mask_kinds=mask_kinds, causal=causal, min_heads=min_heads,
                          allow_empty_rows=True), label="base case")
    inputs = dict(case.inputs)
    trace: dict = {}
    oracle.multi_head_attention(inputs["query"], inputs["key"], inputs["value"], inputs["params"],
                                inputs["num_heads"], trace=trace)
    heads = {"q": trace["q_heads"], "k": trace["k_heads"], "mask": inputs.get("mask"),
             "is_causal": inputs.get("is_causal", False)}
    words = draw_variant_keywords(draw, heads, [n for n in VARIANTS if n in chosen])
    words += draw_sink_chunk_leftpad(draw, heads, [n for n in SINK_FEATURES if n in chosen])
    inputs.update(oracle.variant_options(heads))
    keep_inside(draw, shape_facts("multi_head_attention", inputs))
    return Case("multi_head_attention", inputs, case.clauses, f"{case.label} {' '.join(words)}",
                mask_kind=case.mask_kind)

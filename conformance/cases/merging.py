"""Hypothesis strategies of merge_states: the keys of a drawn attention case cut into P disjoint parts, each part's
state (out_p, lse_p) computed by the oracle, and the stacked states handed to the merge (clauses merge.*).

The cuts reach the corners a merge's arithmetic has: one part (the merge is the identity), two (FlashInfer's
merge_state, a ring step), up to MAX_PARTS; parts without keys (first, last, all of them: a causal block a ring step
skips, a split past the sequence); parts of one key; lse gaps between parts up to 1000 (a part far below the others
underflows to weight 0) and rows whose lse lies near +-100 or 1000 (exp(lse) overflows float32 there: only a merge that
subtracts the maximum survives); a learnable sink given to the merge or held by one part. The attention case under the
cut has masks (rows without keys among them), the causal band, GQA and scores of every magnitude.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import hint
from attention_conformance.conformance.cases.drawing import active_region, keep_inside, small_shapes_inside
from attention_conformance.conformance.cases.limits import KERNEL_HEAD_DIMS, MAX_BATCH, MAX_DIM, MAX_GROUP, \
    MAX_KV_HEADS, MAX_LEN, SCORE_SIGMAS
from attention_conformance.conformance.reference.merging import partial_states

MAX_PARTS = 6
# What a part's scores are shifted by (its lse moves by as much, its output not): most parts unshifted.
LSE_GAPS = (0.0, 0.0, 0.0, 3.0, -3.0, 30.0, -30.0, 90.0, -90.0, 1000.0, -1000.0)
# What every part's lse is shifted by: past +-88.7 a float32 exp(lse) overflows or underflows.
LSE_LEVELS = (0.0, 0.0, 100.0, -100.0, 1000.0)
SINK_MODES = ("none", "merge", "part")
# The covering corners of the merge properties (conformance/harness/properties.py runs each before the random
# draws; a property takes the corner's entries its own strategy admits).
MERGE_CORNERS = (
    {"parts": 2},
    {"parts": 2, "empty": "first"},
    {"parts": 4, "empty": "all-but-one", "one_key": True},
    {"parts": 3, "gaps": True, "level": 1000.0},
    {"parts": 1},
    {"parts": 5, "empty": "last", "level": -100.0},
)


def _cut(draw, rng, lk: int, parts: int, empty: str | None, one_key: bool) -> np.ndarray:
    """(Lk,) the part of each key: at random, then the requested part(s) emptied and one part left one key."""
    owner = rng.integers(0, parts, size=lk)
    if empty == "first" and parts > 1:
        owner = np.where(owner == 0, 1 + rng.integers(0, parts - 1, size=lk), owner)
    elif empty == "last" and parts > 1:
        owner = np.where(owner == parts - 1, rng.integers(0, parts - 1, size=lk), owner)
    elif empty == "all-but-one":
        owner = np.full(lk, int(rng.integers(0, parts)))
    elif empty == "random" and parts > 1:
        gone = rng.integers(0, parts)
        owner = np.where(owner == gone, (gone + 1 + rng.integers(0, parts - 1, size=lk)) % parts, owner)
    if one_key and parts > 1 and lk > 1:
        lonely = int(rng.integers(0, parts))
        owner = np.where(owner == lonely, (lonely + 1) % parts, owner)
        owner[int(rng.integers(0, lk))] = lonely
    return owner


@st.composite
def merge_cases(draw, *, parts=st.integers(1, MAX_PARTS), empty=st.sampled_from((None, None, "first", "last",
                                                                                       "random", "all-but-one")),
                gaps: bool = True, sink_modes=("none",), clauses=("merge.union",), permuted: bool = False) -> Case:
    """A merge_states case: (out (P, B, Hq, Lq, Dv), lse (P, B, Hq, Lq) natural logs, -inf for a part without keys)
    and, in sink mode "merge", the learnable_sink (Hq,) the merge adds once. ``permuted``: the parts in a drawn order
    (merge.order). Labels name the cut: parts, empty ones, gaps, level, sink."""
    region = active_region()
    corner = MERGE_CORNERS[hint("index") % len(MERGE_CORNERS)] if hint("index") is not None else {}
    count = corner.get("parts") or draw(parts, label="parts P")
    emptied = corner.get("empty", draw(empty, label="empty parts"))
    one_key = corner.get("one_key", draw(st.booleans(), label="a part of one key"))
    b = draw(st.integers(1, MAX_BATCH), label="B")
    hkv = draw(st.integers(1, MAX_KV_HEADS), label="Hkv")
    hq = hkv * draw(st.integers(1, MAX_GROUP), label="Hq/Hkv")
    lq = draw(st.integers(1, MAX_LEN), label="Lq")
    lk = draw(st.integers(1, MAX_LEN + 5), label="Lk")
    dk = draw(st.integers(1, MAX_DIM), label="Dk")
    if small_shapes_inside(region):
        dv = draw(st.integers(1, MAX_DIM), label="Dv")
    else:  # a kernel's merge over its own head dims
        dv = draw(st.sampled_from(region.head_dims.members(KERNEL_HEAD_DIMS) or [region.head_dims.min]), label="Dv")
    sink_mode = draw(st.sampled_from(sink_modes), label="sink")
    keep_inside(draw, {"op": "merge_states", "P": count, "B": b, "Hq": hq, "Dv": dv})
    mask_kind = draw(st.sampled_from(("none", "key-padding", "bool-full")), label="mask")
    is_causal = draw(st.booleans(), label="is_causal")
    magnitude = draw(st.sampled_from(tuple(SCORE_SIGMAS)), label="score magnitude")
    level = corner.get("level", draw(st.sampled_from(LSE_LEVELS), label="lse level") if gaps else 0.0)
    gapped = corner.get("gaps", draw(st.booleans(), label="lse gaps") if gaps else False)
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    sigma = SCORE_SIGMAS[magnitude]
    inputs = {"q": rng.standard_normal((b, hq, lq, dk)) * sigma, "k": rng.standard_normal((b, hkv, lk, dk)) * sigma,
              "v": rng.standard_normal((b, hkv, lk, dv))}
    if mask_kind == "key-padding":
        inputs["mask"] = np.arange(lk) < rng.integers(0, lk + 1, size=(b, 1, 1, 1))
    elif mask_kind == "bool-full":
        inputs["mask"] = rng.random((b, hq, lq, lk)) < 0.6
    if is_causal:
        inputs["is_causal"] = True
    if sink_mode != "none":
        inputs["learnable_sink"] = rng.standard_normal(hq) * 2.0
    owner = _cut(draw, rng, lk, count, emptied, one_key)
    offsets = np.full(count, level) + (rng.choice(LSE_GAPS, size=count) if gapped else 0.0)
    out, lse = partial_states(inputs, owner, offsets, sink_part=int(owner[0]) if sink_mode == "part" else None)
    order = np.arange(count)
    if permuted:
        order = np.asarray(draw(st.permutations(list(range(count))), label="order of the parts"))
        out, lse = out[order], lse[order]
    merged = {"out": out, "lse": lse}
    if sink_mode == "merge":
        merged["learnable_sink"] = inputs["learnable_sink"]
    empty_parts = int(np.sum(np.all(np.isneginf(lse), axis=(1, 2, 3))))
    label = (f"P{count} B{b} Hq{hq} Lq{lq} Dv{dv} (keys {lk}, mask={mask_kind}{' causal' if is_causal else ''}, "
             f"scores~{magnitude}) empty parts {empty_parts}{' one-key part' if one_key and count > 1 else ''} "
             f"lse level {level:g}{' gaps ' + str(offsets - level) if gapped else ''} sink={sink_mode}"
             f"{' order ' + str(order.tolist()) if permuted else ''} seed={seed}")
    return Case("merge_states", merged, tuple(clauses), label, notes={"sink": sink_mode})

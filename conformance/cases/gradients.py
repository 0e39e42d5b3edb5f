"""Hypothesis strategies of gradient cases: an sdpa or variant case plus an upstream gradient dO (0 on rows without a
key and on padding rows), boolean masks turned into float ones where the property takes dmask.
"""
from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import CannotBuild, DeterministicDraw
from attention_conformance.conformance.cases.drawing import outside_region, runs_variant
from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.cases.variants import SINK_FEATURES, VARIANTS, sink_chunk_leftpad_cases
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.contract import VARIANT_DEFAULTS


# ----------------------------------------------------------------- strategies
@st.composite
def gradient_cases(draw, *, float_masks_from_bool: bool = False, **sdpa_options) -> Case:
    """An sdpa case plus an upstream gradient ``d_out`` (standard normal, shape of the output).

    With ``float_masks_from_bool`` a boolean mask becomes an additive float one of the
    same (broadcast) shape: a random value where it attends, -inf where it does not.
    """
    return with_upstream_gradient(draw, draw(sdpa_cases(**sdpa_options)), float_masks_from_bool)


def with_upstream_gradient(draw, case: Case, float_masks_from_bool: bool = False) -> Case:
    """``case`` plus its upstream gradient ``d_out`` (gradient_cases). Rows that the contract leaves without a value
    of their own take dO = 0: padding rows i >= query_lengths[b] (unspecified) and rows without a key, whose output
    is the declared FULLY_MASKED_ROWS policy's constant (a learnable sink keeps its rows: they are 0 by definition)."""
    seed = draw(st.integers(0, 2**32 - 1), label="dO seed")
    rng = np.random.default_rng([seed, 1])  # a stream of its own, even when seed equals the values seed
    inputs = dict(case.inputs)
    kind = case.mask_kind
    mask = inputs.get("mask")
    if float_masks_from_bool and mask is not None and mask.dtype == np.bool_:
        inputs["mask"] = np.where(mask, rng.standard_normal(mask.shape), -np.inf)
        kind = f"float {kind} {mask.shape}"
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    inputs["d_out"] = rng.standard_normal(q.shape[:-1] + v.shape[-1:])
    label = case.label.replace(f"mask={case.mask_kind}", f"mask={kind}") + f" dO seed={seed}"
    variants = oracle.variant_options(inputs)
    keep = np.broadcast_to(oracle.judged_rows(q, inputs.get("query_lengths"))[..., None], inputs["d_out"].shape)
    keep = keep & ~oracle.fully_masked_rows(q, k, inputs.get("mask"), bool(inputs.get("is_causal", False)),
                                            **variants)[..., None]
    if not keep.all():
        inputs["d_out"] = np.where(keep, inputs["d_out"], 0.0)
        label += " (dO 0 on rows without a key or padding)"
    return Case("sdpa", inputs, case.clauses, label, mask_kind=kind)


@st.composite
def variant_gradient_cases(draw, *, variants, required, clauses, mask_kinds=("none",), causal=st.booleans(),
                           float_masks_from_bool: bool = False, scale=st.none()) -> Case:
    """A variant case with an upstream gradient: each of ``variants`` (VARIANTS and SINK_FEATURES names) the
    implementation runs drawn with probability 1/2, at least one of ``required``; ``scale`` as sdpa_cases'."""
    runnable = [name for name in variants if runs_variant(name)]
    needed = [name for name in runnable if name in required]
    if not needed:
        outside_region(f"sdpa takes none of the variant keywords {', '.join(required)}")
    chosen = [name for name in runnable if draw(st.booleans(), label=f"uses {name}")]
    if not set(chosen) & set(needed):
        chosen.append(draw(st.sampled_from(needed), label="the variant"))
    case = draw(sink_chunk_leftpad_cases(features=tuple(n for n in SINK_FEATURES if n in chosen),
                                         variants=tuple(n for n in VARIANTS if n in chosen), clauses=clauses,
                                         mask_kinds=mask_kinds, causal=causal, scale=scale), label="variant case")
    softcap = case.inputs.get("softcap")
    if softcap is not None and softcap > GRADIENT_SOFTCAP_MAX:
        # The backward of c * tanh(s / c) multiplies the incoming gradient by c: a float16 autodiff chain overflows
        # past 65504 / |dS| (torch's, for a softcap of 6e4) while the exact gradient is finite, a range limit of
        # the dtype (as the forward keeps scores below 65504). Models cap at 30 to 50 (Grok, Gemma 2).
        word = next(w for w in case.label.split(" (")[0].split() if w.startswith("softcap="))
        case = Case("sdpa", {**case.inputs, "softcap": GRADIENT_SOFTCAP_MAX}, case.clauses,
                    case.label.replace(word, f"softcap={GRADIENT_SOFTCAP_MAX:g} (drawn {word[8:]}, capped for the "
                                             f"backward's float16 range)"), case.mask_kind)
    case = with_upstream_gradient(draw, case, float_masks_from_bool)
    # A case whose every row lost its keys (a window, lengths and a left padding drawn at their edges together: half
    # the key-choosing draws) has every gradient 0 and tests nothing of the backward: drawn again.
    if not np.any(case.inputs["d_out"]):
        if isinstance(draw, DeterministicDraw):
            raise CannotBuild("every row of the case is without a key")
        assume(False)
    return case


GRADIENT_SOFTCAP_MAX = 100.0


def without_keywords(case: Case, names) -> Case:
    dropped = {n: VARIANT_DEFAULTS[n] for n in names}
    if "key_lengths" in names:
        dropped["query_lengths"] = None
    return Case("sdpa", {**case.inputs, **dropped}, case.clauses, f"{case.label} [without {', '.join(names)}]",
                case.mask_kind)

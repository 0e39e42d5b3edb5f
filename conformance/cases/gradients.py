"""Hypothesis strategies of gradient cases: an sdpa or variant case plus an upstream gradient dO (0 on rows without a
key and on padding rows), boolean masks turned into float ones where the property takes dmask; packed batches and
multi-head attention cases with theirs (varlen_gradient_cases, mha_gradient_cases).
"""
from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import CannotBuild, DeterministicDraw
from attention_conformance.conformance.cases.drawing import outside_region, runs_variant
from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.cases.sequences import varlen_cases
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
                           float_masks_from_bool: bool = False, scale=st.none(), all_of: bool = False) -> Case:
    """A variant case with an upstream gradient: each of ``variants`` (VARIANTS and SINK_FEATURES names) the
    implementation runs drawn with probability 1/2, at least one of ``required`` (every one with ``all_of``);
    ``scale`` as sdpa_cases'."""
    runnable = [name for name in variants if runs_variant(name)]
    needed = [name for name in runnable if name in required]
    if not needed:
        outside_region(f"sdpa takes none of the variant keywords {', '.join(required)}")
    # all_of: every one of them (a pairwise corner, conformance/cases/pairwise.py)
    chosen = runnable if all_of else [name for name in runnable if draw(st.booleans(), label=f"uses {name}")]
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
    return Case(case.op, {**case.inputs, **dropped}, case.clauses, f"{case.label} [without {', '.join(names)}]",
                case.mask_kind)


# ------------------------------------------------------------------ packed batches and multi-head attention
def _softcap_for_the_backward(case: Case) -> Case:
    """The case with a softcap above GRADIENT_SOFTCAP_MAX capped there (variant_gradient_cases says why)."""
    softcap = case.inputs.get("softcap")
    if softcap is None or softcap <= GRADIENT_SOFTCAP_MAX:
        return case
    return Case(case.op, {**case.inputs, "softcap": GRADIENT_SOFTCAP_MAX}, case.clauses,
                f"{case.label} (softcap capped at {GRADIENT_SOFTCAP_MAX:g} for the backward's float16 range)",
                case.mask_kind)


def _with_d_out(draw, case: Case, shape: tuple, quiet) -> Case:
    """``case`` plus a standard normal upstream gradient ``d_out`` of ``shape``, 0 where ``quiet`` (broadcastable to
    it) is True; a case whose every row is quiet is drawn again (it tests nothing of the backward)."""
    seed = draw(st.integers(0, 2**32 - 1), label="dO seed")
    d_out = np.random.default_rng([seed, 1]).standard_normal(shape)
    label = f"{case.label} dO seed={seed}"
    quiet = np.broadcast_to(quiet, shape)
    if quiet.any():
        d_out = np.where(quiet, 0.0, d_out)
        label += " (dO 0 on rows without a key or padding)"
    if not np.any(d_out):
        if isinstance(draw, DeterministicDraw):
            raise CannotBuild("every row of the case is without a key")
        assume(False)
    return Case(case.op, {**case.inputs, "d_out": d_out}, case.clauses, label, mask_kind=case.mask_kind)


def packed_rows_without_keys(inputs: dict) -> np.ndarray:
    """(total_q, Hq) boolean: the packed rows of an sdpa_varlen case left without a key under either
    SEQUENCE_ALIGNMENT (the strategy does not know which one the implementation declares; either's rows take dO = 0)."""
    q = np.asarray(inputs["q"])
    rows = np.zeros(q.shape[:2], dtype=bool)
    spans = oracle.varlen_spans(inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], inputs.get("seqused_k"))
    for alignment in oracle.SEQUENCE_ALIGNMENTS:
        for one, (qs, qe, _, _) in zip(oracle.sequence_cases("sdpa_varlen", inputs, alignment), spans):
            if qe > qs:
                keys = {n: x for n, x in one.items() if n not in ("q", "k", "v", "mask", "is_causal", "scale")}
                empty = oracle.fully_masked_rows(one["q"], one["k"], None, one["is_causal"], **keys)[0]  # (Hq, Lq_b)
                rows[qs:qe] |= empty.T
    return rows


@st.composite
def varlen_gradient_cases(draw, **varlen_options) -> Case:
    """An sdpa_varlen case (varlen_cases, ``varlen_options`` its keywords; each of its ``variants`` the implementation
    runs drawn with probability 1/2) plus an upstream gradient d_out (total_q, Hq, Dv), 0 on the rows without a key
    (packed_rows_without_keys)."""
    variants = varlen_options.pop("variants", ())
    chosen = tuple(name for name in variants if draw(st.booleans(), label=f"uses {name}"))  # each with probability 1/2
    case = _softcap_for_the_backward(draw(varlen_cases(variants=chosen, **varlen_options), label="packed case"))
    q, v = case.inputs["q"], case.inputs["v"]
    return _with_d_out(draw, case, q.shape[:2] + v.shape[2:], packed_rows_without_keys(case.inputs)[..., None])


def _removed_keys(inputs: dict, shape: tuple, **keys) -> np.ndarray:
    """(B, Lq, Lk) boolean: the keys some head of a multi-head case's row does not attend under ``keys``."""
    bias = oracle.attention_bias(inputs.get("mask"), bool(inputs.get("is_causal", False)), shape[1], shape[2], **keys)
    bias = np.reshape(bias, (1,) * (4 - bias.ndim) + bias.shape)
    return np.broadcast_to(~np.isfinite(bias), (shape[0],) + bias.shape[1:]).any(axis=1)


def _window_that_matters(draw, case: Case) -> Case:
    """A multi-head case whose window removes no key that the same case without it attends (a side unbounded or past
    every distance, a causal band or lengths that remove the same keys: two of three drawn windows) with one that
    does where it can: sides drawn in 0 .. Lk - 2, the right one 0 under is_causal's band too. Windows drawn at the
    edges alone gave a backward that forgets the window one failing example in fourteen."""
    a = case.inputs
    if a.get("window") is None:
        return case
    b, lq, lk = a["query"].shape[0], a["query"].shape[1], a["key"].shape[1]
    keys = oracle.key_options(oracle.variant_options(a))
    others = {n: x for n, x in keys.items() if n != "window"}
    if lk < 2 or (_removed_keys(a, (b, lq, lk), **keys) & ~_removed_keys(a, (b, lq, lk), **others)).any():
        return case
    window = (draw(st.integers(0, lk - 2), label="window left that matters"),
              draw(st.sampled_from([0, None]), label="window right that matters"))
    return Case(case.op, {**a, "window": window}, case.clauses,
                f"{case.label} (window removing no key: {window} instead)", case.mask_kind)


@st.composite
def mha_gradient_cases(draw, cases, windows_matter: bool = False) -> Case:
    """A multi_head_attention case drawn from ``cases`` (mha_cases or mha_variant_cases) plus an upstream gradient
    d_out (B, Lq, E_out), 0 on padding rows (i >= query_lengths[b]) and on every row one of whose heads has no key:
    such a head's context is the declared FULLY_MASKED_ROWS policy's, and W_o mixes it into the whole row.
    ``windows_matter``: a window that removes no key is drawn again so that it does (_window_that_matters)."""
    case = _softcap_for_the_backward(draw(cases, label="multi-head case"))
    if windows_matter:
        case = _window_that_matters(draw, case)
    a = case.inputs
    shape = a["query"].shape[:2] + (a["params"]["w_o"].shape[1],)
    quiet = oracle.mha_fully_masked_rows(a).any(axis=1)[..., None]  # (B, Lq, 1)
    quiet = quiet | ~oracle.mha_judged_rows(a["query"], a.get("query_lengths"))
    return _with_d_out(draw, case, shape, quiet)

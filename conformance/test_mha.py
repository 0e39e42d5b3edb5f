"""multi_head_attention against the oracle: projections, head split and merge, scale, cross-attention, masks.

Each test draws cases that stress one clause; test_mha_matches_oracle draws everything.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.mha import mha_cases, mha_variant_cases
from attention_conformance.conformance.cases.variants import SINK_FEATURES, VARIANTS
from attention_conformance.conformance.harness.checks import require_device
from attention_conformance.conformance.harness.properties import property_test
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.implementations.contract import missing_keywords_message

pytestmark = [pytest.mark.conformance, pytest.mark.op("multi_head_attention")]


def check(impl, device, dtype, case: Case):
    require_device(impl, device)
    return Judge(impl, dtype, device).check(case)


@property_test(covering_set="brief")
@given(case=mha_cases(clauses=("mha.projections", "mha.output-projection")))
def test_mha_matches_oracle(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief")
@given(case=mha_cases(bias=st.just("input"), cross=st.just(False), mask_kinds=("none",), causal=st.just(False),
                      clauses=("mha.projections",)))
def test_mha_projection_biases(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief")
@given(case=mha_cases(bias=st.just("output"), cross=st.just(False), mask_kinds=("none",), causal=st.just(False),
                      clauses=("mha.output-projection",)))
def test_mha_output_projection(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief")
@given(case=mha_cases(bias=st.just("none"), mask_kinds=("none",), causal=st.just(False), clauses=("mha.head-split",),
                      min_heads=2))
def test_mha_head_split(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief")
@given(case=mha_cases(bias=st.just("none"), mask_kinds=("none",), causal=st.booleans(), clauses=("mha.head-merge",),
                      min_heads=2, min_len=2))
def test_mha_head_merge(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief")
@given(case=mha_cases(bias=st.just("none"), mask_kinds=("none",), causal=st.booleans(), clauses=("mha.scale-head-dim",),
                      min_heads=2, min_len=2))
def test_mha_scale_is_head_width(impl, device, dtype, case):
    check(impl, device, dtype, case)


def heads_split_e(impl) -> str | None:
    return impl.region.mha_head_width_e_over_h and \
        f"{impl.name} declares mha_head_width 'e_over_h' in SUPPORTS: no head width other than E / H"


@property_test(covering_set="brief", requires=heads_split_e)
@given(case=mha_cases(bias=st.just("all"), mask_kinds=("none",), causal=st.just(False), clauses=("mha.head-width-free",),
                      head_width_free=True))
def test_mha_head_width_not_e_over_h(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief")
@given(case=mha_cases(cross=st.just(True), mask_kinds=("none", "key-padding"), causal=st.just(False),
                      clauses=("mha.cross-attention",)))
def test_mha_cross_attention(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief")
@given(case=mha_cases(mask_kinds=("bool-2d", "key-padding", "bool-3d-per-head", "float"), clauses=("mask.broadcast",
                                                                               "mask.bool-true-attends")))
def test_mha_masks(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief")
@given(case=mha_cases(mask_kinds=("none",), causal=st.just(True), cross=st.just(False), clauses=("causal.top-left",)))
def test_mha_causal(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief")
@given(case=mha_cases(mask_kinds=("bool-2d", "key-padding", "float"), allow_empty_rows=True,
                      clauses=("mask.fully-masked-row",)))
def test_mha_fully_masked_rows(impl, device, dtype, case):
    """A fully masked row's context follows the declared policy; the output projection still applies."""
    check(impl, device, dtype, case)


def test_mha_shapes_of_the_documents():
    """The printed pipeline shapes of the documents hold for the oracle (fixtures carry them)."""
    from attention_conformance.conformance.cases.fixtures import fixtures

    traced = [fx for fx in fixtures() if fx.shapes]
    assert traced, "no fixture records intermediate multi-head shapes"
    assert all(np.all(np.isfinite(fx.expected)) for fx in traced if fx.expected is not None)


# ----------------------------------------------------------------- variant keywords (mha.variants)
# sdpa's variant keywords applied to each head's attention after the projections, a random subset of those the
# implementation runs per case (strategies.mha_variant_cases). A failure that passes without one keyword is filed
# under that keyword's own sdpa clause (attribution.py); one that no single keyword explains under mha.variants.
def takes_any(*names: str):
    """``requires`` of property_test: why ``impl``'s multi_head_attention runs none of these variants (None: some)."""
    keywords = [("key_lengths" if name == "lengths" else name) for name in names]

    def reason(impl):
        if not impl.implements("multi_head_attention"):
            return None  # the op mark reports the operation missing
        if any(impl.runs_keyword("multi_head_attention", k) for k in keywords):
            return None
        return f"unsupported: {missing_keywords_message(impl.name, 'multi_head_attention', keywords)}"

    return reason


@property_test(covering_set="brief", requires=takes_any(*VARIANTS), op="multi_head_attention")
@given(case=mha_variant_cases(variants=VARIANTS))
def test_mha_variants(impl, device, dtype, case):
    """Windows, softcap, ALiBi per head, query offsets and lengths inside multi-head attention."""
    check(impl, device, dtype, case)


@property_test(covering_set="brief", requires=takes_any(*SINK_FEATURES), op="multi_head_attention")
@given(case=mha_variant_cases(variants=SINK_FEATURES + ("window", "query_offset"), min_heads=2,
                              required=SINK_FEATURES))
def test_mha_sinks_chunks_leftpad(impl, device, dtype, case):
    """Learnable sinks per head, sink tokens, chunks and left padding inside multi-head attention (two heads or
    more, so a sink or slope read in another head order shows)."""
    check(impl, device, dtype, case)

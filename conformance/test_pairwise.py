"""Every pair of features judged, by construction (conformance/cases/pairwise.py).

For each operation, every two features a case can combine (each variant keyword the implementation runs, a mask
kind, the causal flag, grouped kv heads, a length past a key tile) meet in at least one deterministic corner of a
covering array of strength 2, inside the implementation's declared region, non-causal wherever the causal band
could hide the pair, at keyword values where both act; then a random draw of two features. softmax meets every axis
of every rank. A fault only two features produce together is named with both clauses (conformance/judging/
attribution.py). The backward's pairs are in conformance/test_variant_gradients.py.
"""
from __future__ import annotations

import pytest
from hypothesis import given

from attention_conformance.conformance.cases.pairwise import (
    OP_KEYWORDS,
    feature_pair_cases,
    mha_pair_cases,
    sequence_pair_cases,
)
from attention_conformance.conformance.cases.softmax import softmax_axis_cases
from attention_conformance.conformance.harness.checks import check, needs_keywords, needs_op_keywords
from attention_conformance.conformance.harness.properties import property_test

pytestmark = pytest.mark.conformance


@property_test(covering_set="pairwise", requires=needs_keywords(combined=OP_KEYWORDS["sdpa"], at_least=1))
@pytest.mark.op("sdpa")
@given(case=feature_pair_cases())
def test_every_pair_of_sdpa_features(impl, device, dtype, case):
    """The variant keywords at values where both act, a mask kind, the causal flag, grouped heads, past a tile."""
    check(impl, device, dtype, case)


@property_test(covering_set="pairwise", op="softmax")
@pytest.mark.op("softmax")
@given(case=softmax_axis_cases())
def test_softmax_every_axis_of_every_rank(impl, device, dtype, case):
    """softmax's axis against its rank: every axis, negative and non-negative, of ranks 1 to 4."""
    check(impl, device, dtype, case)


@property_test(covering_set="pairwise", op="sdpa_varlen",
               requires=needs_op_keywords("sdpa_varlen", *OP_KEYWORDS["sdpa_paged"], any_of=True))
@pytest.mark.op("sdpa_varlen")
@given(case=sequence_pair_cases("sdpa_varlen"))
def test_every_pair_of_varlen_features(impl, device, dtype, case):
    """A packed batch's variant keywords, seqused_k, the causal flag and grouped heads, two by two."""
    check(impl, device, dtype, case)


@property_test(covering_set="pairwise", op="sdpa_paged",
               requires=needs_op_keywords("sdpa_paged", *OP_KEYWORDS["sdpa_paged"], any_of=True))
@pytest.mark.op("sdpa_paged")
@given(case=sequence_pair_cases("sdpa_paged"))
def test_every_pair_of_paged_features(impl, device, dtype, case):
    """A paged cache's variant keywords, the causal flag and grouped heads, two by two."""
    check(impl, device, dtype, case)


@property_test(covering_set="pairwise", op="multi_head_attention",
               requires=needs_op_keywords("multi_head_attention", *("key_lengths" if k == "lengths" else k
                                                                    for k in OP_KEYWORDS["multi_head_attention"]),
                                          any_of=True))
@pytest.mark.op("multi_head_attention")
@given(case=mha_pair_cases())
def test_every_pair_of_mha_features(impl, device, dtype, case):
    """Each head's variant keywords, a key-padding or float mask and the causal flag, two by two."""
    check(impl, device, dtype, case)

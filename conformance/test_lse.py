"""The log-sum-exp beside the output (return_lse=True; clauses lse.*; docs/contract.md, "The log-sum-exp").

Each property draws the cases of an existing one (sdpa, its variants, a learnable sink, packed and paged batches),
asks for (out, lse), judges the output as always and the lse against the oracle's in the implementation's declared
LSE_CONVENTION (conformance/judging/lse_verdicts.py). An implementation whose signature lacks return_lse is skipped at
collection, never failed.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.cases.sequences import paged_cases, varlen_cases
from attention_conformance.conformance.cases.variants import VARIANTS, sink_chunk_leftpad_cases, variant_cases
from attention_conformance.conformance.harness.checks import lse_judge_for, needs_keywords, needs_op_keywords
from attention_conformance.conformance.harness.properties import UNLESS_COMPILED, property_test
from attention_conformance.conformance.judging.lse_verdicts import with_lse

pytestmark = pytest.mark.conformance
sdpa_op = pytest.mark.op("sdpa")


def check_lse(impl, device, dtype, case):
    lse_judge_for(impl, device, dtype).check(with_lse(case))


@property_test(requires=needs_keywords("return_lse"))
@sdpa_op
@given(case=sdpa_cases(allow_empty_rows=True, clauses=("lse.definition",)))
def test_lse_matches_oracle(impl, device, dtype, case):
    """Every mask kind, the causal flag, scales of both signs, large scores, GQA: lse[b, h, i] = log sum_j exp(s_ij)."""
    check_lse(impl, device, dtype, case)


# Decode against a long cache: a split-KV kernel combines its splits' partial states by their lse, a step that
# exists only on this path.
@property_test(requires=needs_keywords("return_lse"))
@sdpa_op
@given(case=sdpa_cases(mask_kinds=("none", "key-padding", "float"), causal=st.just(False), query_mode="decode",
                       clauses=("lse.definition",)))
def test_lse_decode_against_a_long_cache(impl, device, dtype, case):
    check_lse(impl, device, dtype, case)


@property_test(requires=needs_keywords("return_lse"))
@sdpa_op
@given(case=sdpa_cases(mask_kinds=("bool-full", "key-padding", "float", "query-padding"), allow_empty_rows=True,
                       clauses=("lse.fully-masked-row",)))
def test_lse_of_rows_without_keys(impl, device, dtype, case):
    """A row without keys: lse -inf, or the value LSE_CONVENTION declares."""
    check_lse(impl, device, dtype, case)


@property_test(covering_set="brief", kernel_corners=UNLESS_COMPILED,
               requires=needs_keywords("return_lse", combined=VARIANTS, at_least=1))
@sdpa_op
@given(case=variant_cases(variants=(), optional=VARIANTS, clauses=("lse.variants",)))
def test_lse_after_the_variants(impl, device, dtype, case):
    """softcap, ALiBi, windows, offsets and key lengths act on the lse as on the output."""
    check_lse(impl, device, dtype, case)


@property_test(covering_set="brief", kernel_corners=UNLESS_COMPILED,
               requires=needs_keywords("return_lse", "learnable_sink"))
@sdpa_op
@given(case=sink_chunk_leftpad_cases(features=("learnable_sink",), clauses=("lse.learnable-sink",),
                                     mask_kinds=("none", "bool-full", "key-padding", "float")))
def test_lse_with_a_learnable_sink(impl, device, dtype, case):
    """The sink's term in the denominator once (or left out, as declared)."""
    check_lse(impl, device, dtype, case)


@property_test(covering_set="brief", op="sdpa_varlen", requires=needs_op_keywords("sdpa_varlen", "return_lse"))
@pytest.mark.op("sdpa_varlen")
@given(case=varlen_cases(clauses=("lse.varlen",)))
def test_lse_of_packed_batches(impl, device, dtype, case):
    check_lse(impl, device, dtype, case)


@property_test(covering_set="brief", op="sdpa_paged", requires=needs_op_keywords("sdpa_paged", "return_lse"))
@pytest.mark.op("sdpa_paged")
@given(case=paged_cases(clauses=("lse.paged",)))
def test_lse_of_paged_caches(impl, device, dtype, case):
    check_lse(impl, device, dtype, case)

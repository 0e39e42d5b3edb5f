"""Merging partial attention states (merge_states; clauses merge.*; docs/contract.md, "Merging partial states").

Each property draws an attention case, cuts its keys into parts, computes each part's state (out, lse) with the
oracle and asks the implementation to merge them (conformance/cases/merging.py); the merged (out, lse) is judged
against the exact merge of the parts given (conformance/judging/merge_verdicts.py). An implementation without
merge_states is reported not implemented, never failed.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_conformance.conformance.cases.merging import merge_cases
from attention_conformance.conformance.harness.checks import merge_judge_for, needs_op_keywords
from attention_conformance.conformance.harness.properties import property_test

pytestmark = [pytest.mark.conformance, pytest.mark.op("merge_states")]


def check_merge(impl, device, dtype, case):
    merge_judge_for(impl, device, dtype).check(case)


def sink_counted(impl):
    """``requires``: a part whose state holds the sink merges only where lse counts it (LSE_CONVENTION sink)."""
    if impl.implements("merge_states") and impl.lse_convention["sink"] != "included":
        return ("does not apply: LSE_CONVENTION sink 'excluded' leaves the sink out of a part's lse, so a part holding "
                "it has no mergeable state")
    return None


@property_test(covering_set="brief", op="merge_states")
@given(case=merge_cases(empty=st.just(None), gaps=False))
def test_merge_equals_attention_over_the_union(impl, device, dtype, case):
    """One to six parts of random keys: lse = log sum_p exp(lse_p), out = sum_p exp(lse_p - lse) out_p."""
    check_merge(impl, device, dtype, case)


@property_test(covering_set="brief", op="merge_states")
@given(case=merge_cases(empty=st.sampled_from(("first", "last", "random", "all-but-one")), gaps=False,
                        clauses=("merge.empty-part",)))
def test_merge_of_parts_without_keys(impl, device, dtype, case):
    """A part with lse -inf weighs nothing, first, last or anywhere; rows no part has a key for merge to out 0."""
    check_merge(impl, device, dtype, case)


@property_test(covering_set="brief", op="merge_states")
@given(case=merge_cases(parts=st.integers(2, 6)))
def test_merge_across_huge_lse_gaps(impl, device, dtype, case):
    """Parts whose lse differ by up to 2000 and rows whose lse lies near +-100 or 1000, where exp(lse) overflows
    float32: only a merge that subtracts the largest lse survives."""
    check_merge(impl, device, dtype, case)


@property_test(covering_set="brief", op="merge_states")
@given(case=merge_cases(parts=st.integers(2, 6), permuted=True, clauses=("merge.order",)))
def test_merge_in_any_order(impl, device, dtype, case):
    """The parts in a drawn order, empty ones and gaps among them: the same merge."""
    check_merge(impl, device, dtype, case)


@property_test(covering_set="brief", op="merge_states", requires=needs_op_keywords("merge_states", "learnable_sink"))
@given(case=merge_cases(sink_modes=("merge",), clauses=("merge.sink-once",)))
def test_merge_counts_a_given_sink_once(impl, device, dtype, case):
    """A learnable sink given to the merge adds exp(sigma_h) to the denominator once, whatever the number of parts."""
    check_merge(impl, device, dtype, case)


@property_test(covering_set="brief", op="merge_states", requires=sink_counted)
@given(case=merge_cases(parts=st.integers(2, 6), sink_modes=("part",), clauses=("merge.sink-once",)))
def test_merge_of_a_part_holding_the_sink(impl, device, dtype, case):
    """One part's state counts the sink (split 0 of a split-KV kernel): the merge must not add it again."""
    check_merge(impl, device, dtype, case)

"""Paged KV caches, sdpa_paged (docs/contract.md; spec/clauses.yaml paged.*): one property per clause against the
oracle (each sequence's keys gathered page by page, then sdpa; conformance/reference/oracle.py), drawn by
strategies.paged_cases: pages shuffled across the pool, a page shared by two sequences, last pages partly or exactly
filled, and large finite garbage in every slot, page and table entry no sequence uses.

An implementation without sdpa_paged is reported not implemented; one whose signature lacks a keyword a property
needs is skipped at collection, never failed. Each property runs the brief covering set
(conformance/harness/properties.py).
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_conformance.conformance.cases.sequences import SEQUENCE_VARIANT_NAMES, paged_cases
from attention_conformance.conformance.harness.checks import check, needs_op_keywords
from attention_conformance.conformance.harness.properties import property_test

pytestmark = pytest.mark.conformance
paged_op = pytest.mark.op("sdpa_paged")


@property_test(covering_set="brief", op="sdpa_paged")
@paged_op
@given(case=paged_cases(clauses=("paged.definition", "paged.block-table", "paged.seqused-k")))
def test_paged_matches_oracle(impl, device, dtype, case):
    """Shuffled and shared pages, page boundaries at the last key, garbage past seqused_k: fixtures/varlen_paged.yaml
    names the table's and the used length's own clauses on hand-worked caches."""
    check(impl, device, dtype, case)


@property_test(covering_set="brief", op="sdpa_paged")
@paged_op
@given(case=paged_cases(clauses=("paged.alignment",), causal=st.just(True)))
def test_paged_alignment(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief", op="sdpa_paged",
               requires=needs_op_keywords("sdpa_paged", *SEQUENCE_VARIANT_NAMES, any_of=True))
@paged_op
@given(case=paged_cases(clauses=("paged.variants",), variants=SEQUENCE_VARIANT_NAMES))
def test_paged_variants(impl, device, dtype, case):
    check(impl, device, dtype, case)

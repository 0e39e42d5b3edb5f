"""Packed variable-length batches, sdpa_varlen (docs/contract.md; spec/clauses.yaml varlen.*): one property per
clause against the oracle (sequence by sequence through sdpa, conformance/reference/oracle.py), drawn at the corners of
strategies.varlen_cases, and the agreement of the packed batch with the padded one for an implementation that
exposes both operations.

An implementation without sdpa_varlen is reported not implemented; one whose signature lacks a keyword a property
needs is skipped at collection, never failed. Each property runs the brief covering set
(conformance/harness/properties.py).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.sequences import SEQUENCE_VARIANT_NAMES, varlen_cases
from attention_conformance.conformance.harness.checks import check, judge_for, needs_op_keywords
from attention_conformance.conformance.harness.properties import property_test

pytestmark = pytest.mark.conformance


varlen_op = pytest.mark.op("sdpa_varlen")



# ----------------------------------------------------------------- against the oracle
@property_test(covering_set="brief", op="sdpa_varlen")
@varlen_op
@given(case=varlen_cases(clauses=("varlen.definition", "varlen.cu-seqlens", "varlen.empty-sequence")))
def test_varlen_matches_oracle(impl, device, dtype, case):
    """Sequence boundaries, empty sequences, Lq_b > Lk_b, grouped heads: fixtures/varlen_paged.yaml names the
    offsets' own clause (varlen.cu-seqlens) on hand-worked batches."""
    check(impl, device, dtype, case)


def _unequal_sequences(impl):
    """Why the alignment property (causal, a sequence with Lq_b != Lk_b) cannot reach an implementation: its region
    keeps every causal sequence's lengths equal."""
    why = impl.region.why_outside({"op": "sdpa_varlen", "is_causal": True, "equal_sequences": False},
                                  ask_supports=False)
    return f"outside the declared region: {why}" if why else None


@property_test(covering_set="brief", op="sdpa_varlen", requires=_unequal_sequences)
@varlen_op
@given(case=varlen_cases(clauses=("varlen.alignment",), causal=st.just(True), unequal=True))
def test_varlen_alignment(impl, device, dtype, case):
    """is_causal with sequences of Lq_b != Lk_b: the alignment the implementation declares decides every row."""
    check(impl, device, dtype, case)


@property_test(covering_set="brief", op="sdpa_varlen", requires=needs_op_keywords("sdpa_varlen", "seqused_k"))
@varlen_op
@given(case=varlen_cases(clauses=("varlen.seqused-k",), seqused=st.just(True)))
def test_varlen_seqused_k(impl, device, dtype, case):
    check(impl, device, dtype, case)


@property_test(covering_set="brief", op="sdpa_varlen",
               requires=needs_op_keywords("sdpa_varlen", *SEQUENCE_VARIANT_NAMES, any_of=True))
@varlen_op
@given(case=varlen_cases(clauses=("varlen.variants",), variants=SEQUENCE_VARIANT_NAMES))
def test_varlen_variants(impl, device, dtype, case):
    check(impl, device, dtype, case)


# ----------------------------------------------------------------- the packed batch against the padded one
def padded_batch(case: Case, alignment: str) -> tuple[Case, list[tuple[int, int, int, int]]]:
    """The padded sdpa case of a packed batch (varlen.padded-agreement) and, per sequence, (first packed row, batch
    row, first padded row, Lq_b). Top-left: queries and keys at the start of their buffers, key_lengths. Bottom-right:
    at the end, key_leftpad = Lk_pad - Lk_b and query_offset = Lk_pad - Lq_pad, which keep each sequence's
    positions (sdpa.key-leftpad); Lk_pad >= Lq_pad so that the offset is >= 0."""
    a = case.inputs
    starts_q, starts_k = np.asarray(a["cu_seqlens_q"]), np.asarray(a["cu_seqlens_k"])
    lq_b = np.diff(starts_q)
    lk_b = np.diff(starts_k) if a.get("seqused_k") is None else np.asarray(a["seqused_k"])
    b, hq, hkv = len(lq_b), a["q"].shape[1], a["k"].shape[1]
    lq_pad = max(int(lq_b.max()), 1)
    lk_pad = max(int(lk_b.max()), lq_pad if alignment == "bottom-right" else 1)
    q = np.zeros((b, hq, lq_pad, a["q"].shape[2]))
    k = np.zeros((b, hkv, lk_pad, a["k"].shape[2]))
    v = np.zeros((b, hkv, lk_pad, a["v"].shape[2]))
    rows = []
    for example in range(b):
        nq, nk = int(lq_b[example]), int(lk_b[example])
        at_q = lq_pad - nq if alignment == "bottom-right" else 0
        at_k = lk_pad - nk if alignment == "bottom-right" else 0
        q[example, :, at_q:at_q + nq] = np.swapaxes(a["q"][starts_q[example]:starts_q[example] + nq], 0, 1)
        k[example, :, at_k:at_k + nk] = np.swapaxes(a["k"][starts_k[example]:starts_k[example] + nk], 0, 1)
        v[example, :, at_k:at_k + nk] = np.swapaxes(a["v"][starts_k[example]:starts_k[example] + nk], 0, 1)
        rows.append((int(starts_q[example]), example, at_q, nq))
    inputs = {"q": q, "k": k, "v": v, **{name: a[name] for name in ("is_causal", "scale", *SEQUENCE_VARIANT_NAMES)
                                         if a.get(name) is not None}}
    if alignment == "bottom-right":
        inputs["key_leftpad"] = (lk_pad - lk_b).astype(np.int32)
        if lk_pad != lq_pad:
            inputs["query_offset"] = lk_pad - lq_pad
    else:
        inputs["key_lengths"] = lk_b.astype(np.int32)
    return Case("sdpa", inputs, ("varlen.padded-agreement",), f"{case.label} [padded, {alignment}]"), rows


def _padded_keywords(impl) -> tuple[str, ...]:
    return ("key_leftpad", "query_offset") if impl.sequence_alignment == "bottom-right" else ("key_lengths",)


def _exposes_padded_form(impl):
    """``requires``: the property compares sdpa_varlen with the implementation's own sdpa on the padded batch."""
    if not impl.implements("sdpa_varlen"):
        return None
    if not impl.implements("sdpa"):
        return f"not applicable: {impl.name} exposes no sdpa to compare its packed batches with"
    return needs_op_keywords("sdpa", *_padded_keywords(impl))(impl)


@property_test(covering_set="brief", op="sdpa_varlen", requires=_exposes_padded_form)
@varlen_op
@given(case=varlen_cases(clauses=("varlen.padded-agreement",), variants=SEQUENCE_VARIANT_NAMES))
def test_varlen_equals_padded_sdpa(impl, device, dtype, case):
    """The packed batch through sdpa_varlen and the same batch padded through sdpa agree row by row, each within
    its own allowance (the packed one is judged against the oracle first)."""
    judge = judge_for(impl, device, dtype)
    packed, inputs = judge.check(case)
    padded_case, rows = padded_batch(case, impl.sequence_alignment)
    padded, padded_inputs = judge.run(padded_case)
    allowed_packed = np.broadcast_to(judge.allowed(case, inputs), packed.shape)
    allowed_padded = np.broadcast_to(judge.allowed(padded_case, padded_inputs), padded.shape)
    as_packed = np.zeros_like(packed)
    allowed = allowed_packed.copy()
    for first, example, at, count in rows:
        as_packed[0, :, first:first + count] = padded[example, :, at:at + count]
        allowed[0, :, first:first + count] += allowed_padded[example, :, at:at + count]
    both_nan = np.isnan(packed) & np.isnan(as_packed)
    error = np.where(both_nan, 0.0, np.abs(packed - as_packed))
    worst = np.unravel_index(int(np.argmax(np.nan_to_num(error - allowed, nan=np.inf))), error.shape)
    if not error[worst] <= allowed[worst]:
        judge.fail("varlen.padded-agreement", case, inputs,
                   f"sdpa_varlen and sdpa on the padded batch ({impl.sequence_alignment} alignment: "
                   f"{', '.join(_padded_keywords(impl))}) differ by {error[worst]:.3e} > allowed {allowed[worst]:.3e}",
                   f"{judge.element(case, inputs, worst)}: packed {packed[worst]:.9g}, padded {as_packed[worst]:.9g}")
    judge.record(case, "varlen.padded-agreement", "passed", max_abs_error=float(np.max(error, initial=0.0)),
                 allowed=float(allowed[worst]) if allowed.size else 0.0)

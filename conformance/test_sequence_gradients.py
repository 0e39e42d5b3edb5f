"""Gradients of packed variable-length batches (sdpa_varlen; clause grad.varlen), where packed training
differentiates them (FlashAttention's flash_attn_varlen_func backward).

A packed batch is B independent sdpa's: for an upstream gradient dO (total_q, Hq, Dv), 0 on the rows without a key
(varlen_gradient_cases), the implementation's own sdpa_varlen is differentiated with its framework's autodiff with
respect to the packed q, k, v and a learnable sink (conformance/judging/composed_gradients.py) and judged against the
float64 analytic backward sequence by sequence (conformance/reference/backward.py varlen_backward): sequence b's dq
rows and its used keys' dk, dv rows are its sdpa case's, a key past seqused_k or of a sequence without queries takes
exactly 0, dsink sums the sequences'. The forward of the same call is judged first (varlen.definition, or
varlen.variants with a variant keyword).

Applies to implementations with autodiff (ARRAY torch or jax, GRADIENTS not False) that expose sdpa_varlen.
"""
from __future__ import annotations

import pytest
from hypothesis import given

from attention_conformance.conformance.cases.gradients import varlen_gradient_cases
from attention_conformance.conformance.cases.sequences import SEQUENCE_VARIANT_NAMES
from attention_conformance.conformance.harness.checks import require_device, without_autodiff
from attention_conformance.conformance.harness.properties import property_test
from attention_conformance.conformance.judging.composed_gradients import ComposedGradientJudge, judge_composed

pytestmark = pytest.mark.conformance


varlen_op = pytest.mark.op("sdpa_varlen")


@property_test(covering_set="brief", op="sdpa_varlen", requires=without_autodiff)
@varlen_op
@given(case=varlen_gradient_cases(clauses=("grad.varlen",), variants=SEQUENCE_VARIANT_NAMES))
def test_varlen_gradients(impl, device, dtype, case):
    """dq, dk, dv (and dsink) of a packed batch, sequence by sequence: no gradient crosses a sequence boundary, none
    reaches the keys past seqused_k, each sequence's as its own sdpa's (empty sequences, Lq_b > Lk_b, grouped heads,
    the window, softcap, ALiBi and the learnable sink where the implementation runs them)."""
    require_device(impl, device)
    judge_composed(ComposedGradientJudge(impl, dtype, device), case, case.rounded(dtype))

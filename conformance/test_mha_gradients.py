"""Gradients of multi_head_attention (clauses grad.mha, grad.mha-variants): what training differentiates, the
projections' parameters included.

For an upstream gradient dY (B, Lq, E_out), 0 on padding rows and on rows one of whose heads has no key
(mha_gradient_cases), the implementation's own multi_head_attention is differentiated with its framework's autodiff
with respect to query, key, value, every parameter of ``params`` (w_q ... b_o) and a learnable sink
(conformance/judging/composed_gradients.py), and judged against the float64 chain rule through the pipeline
(conformance/reference/backward.py mha_backward: the output projection, each head's sdpa backward with the variant
keywords, the input projections). The forward of the same call is judged first (mha.projections, or mha.variants).

A variant case's gradient beyond its tolerance is filed under grad.mha when the same case without its keywords
disagrees too, else under grad.mha-variants, naming the first keyword whose removal makes it agree.

Applies to implementations with autodiff (ARRAY torch or jax, GRADIENTS not False); the variant properties to those
whose multi_head_attention takes one of their keywords.
"""
from __future__ import annotations

import pytest
from hypothesis import given

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.gradients import mha_gradient_cases, without_keywords
from attention_conformance.conformance.cases.mha import mha_cases, mha_variant_cases
from attention_conformance.conformance.cases.variants import SINK_FEATURES, VARIANTS
from attention_conformance.conformance.harness.checks import needs_op_keywords, require_device, without_autodiff
from attention_conformance.conformance.harness.properties import property_test
from attention_conformance.conformance.judging.composed_gradients import (
    ComposedGradientJudge,
    composed_agrees,
    judge_composed,
)
from attention_conformance.conformance.reference import oracle

pytestmark = [pytest.mark.conformance, pytest.mark.op("multi_head_attention")]


# The order the blame takes the keywords out in: those that choose keys or add a constant bias first, softcap and the
# learnable sink (which change every weight of a row) last, as test_variant_gradients' blame does.
KEYWORD_ORDER = ("sink_token_length", "attention_chunk", "key_leftpad", "alibi_slopes", "window", "key_lengths",
                 "query_offset", "softcap", "learnable_sink")


def mha_variant_blame(judge, case: Case, inputs: dict, name: str) -> tuple[str, str]:
    """(clause, note) of a variant case's gradient ``name`` beyond its tolerance: grad.mha when the case without any
    of its keywords disagrees too, else grad.mha-variants with the first keyword whose removal makes it agree."""
    used = [n for n in KEYWORD_ORDER if n in oracle.variant_options(case.inputs)]
    if name == "dsink":
        used = [n for n in used if n != "learnable_sink"]
    elif used and not composed_agrees(judge, without_keywords(case, used), name):
        return "grad.mha", f"; it disagrees without {', '.join(used)} too: the plain multi-head backward is at fault"
    for keyword in used:
        if composed_agrees(judge, without_keywords(case, [keyword]), name):
            return "grad.mha-variants", f"; the same case without {keyword} agrees: {keyword}'s backward is at fault"
    return "grad.mha-variants", ""


def differentiable_mha_with(*names: str):
    """``requires``: autodiff, and a multi_head_attention that takes one of the variant keywords ``names`` (VARIANTS and
    SINK_FEATURES names)."""
    keywords = ["key_lengths" if name == "lengths" else name for name in names]

    def reason(impl):
        return without_autodiff(impl) or needs_op_keywords("multi_head_attention", *keywords, any_of=True)(impl)

    return reason


@property_test(covering_set="brief", requires=without_autodiff, op="multi_head_attention")
@given(case=mha_gradient_cases(mha_cases(clauses=("grad.mha",))))
def test_mha_gradients(impl, device, dtype, case):
    """dquery, dkey, dvalue and every parameter's gradient: projections with and without biases, cross-attention,
    head widths other than E / H, masks and the causal flag."""
    require_device(impl, device)
    judge_composed(ComposedGradientJudge(impl, dtype, device), case, case.rounded(dtype))


# Two properties, as the forward's (test_mha.py): all nine keywords at once in one property hid each other (a window
# that removes a key beside lengths, sink tokens and a chunk that remove it too), and a backward forgetting the window
# failed one example in fourteen.
@property_test(covering_set="brief", requires=differentiable_mha_with(*VARIANTS), op="multi_head_attention")
@given(case=mha_gradient_cases(mha_variant_cases(variants=VARIANTS, clauses=("grad.mha-variants",), min_heads=2),
                               windows_matter=True))
def test_mha_variant_gradients(impl, device, dtype, case):
    """Windows, softcap, ALiBi per head, query offsets and lengths acting on every head: removed keys take no
    gradient, softcap's derivative reaches the projections, two heads or more so a per-head slope read in another
    head order shows."""
    require_device(impl, device)
    judge_composed(ComposedGradientJudge(impl, dtype, device), case, case.rounded(dtype), blame=mha_variant_blame)


@property_test(covering_set="brief", requires=differentiable_mha_with(*SINK_FEATURES), op="multi_head_attention")
@given(case=mha_gradient_cases(mha_variant_cases(variants=SINK_FEATURES + ("window", "query_offset"),
                                                 required=SINK_FEATURES, clauses=("grad.mha-variants",), min_heads=2),
                               windows_matter=True))
def test_mha_sink_gradients(impl, device, dtype, case):
    """Learnable sinks per head (dsink of head h of the split), sink tokens, chunks and left padding."""
    require_device(impl, device)
    judge_composed(ComposedGradientJudge(impl, dtype, device), case, case.rounded(dtype), blame=mha_variant_blame)

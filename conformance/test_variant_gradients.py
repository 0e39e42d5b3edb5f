"""Gradients of the sdpa variants against the float64 analytic backward (clauses grad.softcap, grad.variants,
grad.learnable-sink; docs/gradients.md derives them).

Each property draws a variant case (strategies.sink_chunk_leftpad_cases, so the keywords sit at the same edges as
in the forward properties) with a random subset of the keywords the implementation runs, adds an upstream gradient
(test_gradients.with_upstream_gradient: dO = 0 on rows without a key and on padding rows) and judges the forward
(the variant's own forward clause) and then dq, dk, dv, dmask and, with a learnable sink, dsink, as
test_gradients.judge_gradients does. A gradient beyond its tolerance is blamed (variant_blame) on the plain gradient
clause (grad.sdpa-q ...) when the case without any of its keywords disagrees too; else on the first keyword that
alone reproduces it, else on the first whose removal makes it agree (KEYWORD_CLAUSES' order).

Applies to implementations with autodiff (test_gradients.without_autodiff) whose sdpa runs the keywords.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.gradients import without_keywords, variant_gradient_cases
from attention_conformance.conformance.cases.pairwise import gradient_pair_cases
from attention_conformance.conformance.harness.checks import gradient_judge_for, without_autodiff
from attention_conformance.conformance.harness.properties import property_test
from attention_conformance.conformance.judging.gradient_verdicts import (
    GRAD_CLAUSE,
    gqa_blame,
    gradient_agrees,
    judge_gradients,
)
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.contract import missing_keywords_message

pytestmark = pytest.mark.conformance


sdpa_op = pytest.mark.op("sdpa")


# The gradient clause of each keyword, in the order the blame tries them: first the keywords that only choose keys
# or add a constant bias (taking one out adds keys, which hides no other fault), then softcap and the learnable sink,
# which change every score or weight of a row: a case can agree without them while another keyword is at fault (a
# window the backward forgot was filed under grad.softcap when softcap came first; softcap's derivative under
# grad.learnable-sink in a one-key row, whose softmax Jacobian is 0 without the sink, when the sink came first).
KEYWORD_CLAUSES = (("sink_token_length", "grad.variants"), ("attention_chunk", "grad.variants"),
                   ("key_leftpad", "grad.variants"), ("alibi_slopes", "grad.variants"), ("window", "grad.variants"),
                   ("key_lengths", "grad.variants"), ("query_offset", "grad.variants"), ("softcap", "grad.softcap"),
                   ("learnable_sink", "grad.learnable-sink"))


# The forward clause a variant gradient test judges the output of the same call under.
FORWARD_CLAUSES = {"grad.softcap": "sdpa.softcap", "grad.learnable-sink": "sdpa.learnable-sink",
                   "grad.variants": "sdpa.variant-order"}


def differentiable_with(*names: str):
    """``requires`` of property_test: autodiff, and an sdpa that runs one of the variants ``names`` (VARIANTS and
    SINK_FEATURES names; the first is the one every case uses when ``names`` has one)."""
    keywords = ["key_lengths" if name == "lengths" else name for name in names]

    def reason(impl):
        why = without_autodiff(impl)
        if why or not impl.implements("sdpa"):
            return why
        if any(impl.runs_keyword("sdpa", k) for k in keywords):
            return None
        return f"unsupported: {missing_keywords_message(impl.name, 'sdpa', keywords)}"

    return reason


def _agrees(judge, case: Case, name: str) -> bool:
    """Whether the implementation's gradient ``name`` of ``case`` agrees with the analytic backward."""
    return gradient_agrees(judge, case, case.rounded(judge.dtype), name)


def variant_blame(judge, case: Case, inputs: dict, name: str) -> tuple[str, str]:
    """(clause, note) for a variant case's gradient ``name`` beyond its tolerance.

    For dq, dk, dv and dmask: the plain clause (gqa_blame) when the case without any of its keywords disagrees too;
    else the gradient clause (KEYWORD_CLAUSES) of the first keyword that alone, the others taken out, reproduces the
    disagreement; else of the first whose removal makes it agree; else the test's own clause (only all of them
    together explain it). For dsink the same over the other keywords, grad.learnable-sink when none explains it."""
    used = [n for n, _ in KEYWORD_CLAUSES if n in oracle.variant_options(case.inputs)]
    clauses = dict(KEYWORD_CLAUSES)
    if name == "dsink":
        used = [n for n in used if n != "learnable_sink"]
    elif not _agrees(judge, without_keywords(case, used), name):
        clause, note = gqa_blame(judge, case, inputs, name)
        return clause, note + f"; it disagrees without {', '.join(used)} too: the plain backward is at fault"
    alone = used if name != "dsink" else []  # dsink needs the sink: no keyword is alone beside it
    for keyword in alone:
        if len(used) == 1 or not _agrees(judge, without_keywords(case, [n for n in used if n != keyword]), name):
            return clauses[keyword], (f"; the same case with {keyword} alone disagrees too (and agrees without every "
                                      f"variant keyword): {keyword}'s backward is at fault")
    for keyword in used:
        if _agrees(judge, without_keywords(case, [keyword]), name):
            return clauses[keyword], f"; the same case without {keyword} agrees: {keyword}'s backward is at fault"
    if name == "dsink":
        return GRAD_CLAUSE[name], ""
    return case.clauses[0], f"; it agrees without all of {', '.join(used)}, not without any one alone"


def check_variant_gradients(impl, device, dtype, case: Case, order=("dq", "dk", "dv", "dmask", "dsink")) -> None:
    judge = gradient_judge_for(impl, device, dtype)
    inputs = case.rounded(dtype)
    # Rows declared NaN (FULLY_MASKED_ROWS) leave the gradients they reach unjudged, every other one is judged
    # (gradient_verdicts.nan_row_unjudged).
    judge_gradients(judge, case, inputs, order=order, forward_clause=FORWARD_CLAUSES[case.clauses[0]],
                    blame=variant_blame)


# ----------------------------------------------------------------------- tests
@property_test(requires=differentiable_with("softcap"), covering_set="brief")
@sdpa_op
@given(case=variant_gradient_cases(variants=("softcap",), required=("softcap",), clauses=("grad.softcap",),
                                   mask_kinds=("none", "float", "key-padding"), float_masks_from_bool=True,
                                   scale=st.none() | st.sampled_from([-0.35, 0.7, 2.0])))
def test_softcap_gradients(impl, device, dtype, case):
    """dq and dk carry softcap's derivative 1 - tanh^2(s / c) at the scaled score s (an explicit scale too: a
    independently written backward that took the derivative at 1/sqrt(Dk) passed while every case had the default); an
    additive
    mask after the cap takes dS itself."""
    check_variant_gradients(impl, device, dtype, case, order=("dq", "dk", "dmask", "dv"))


KEY_CHOOSING = ("window", "alibi_slopes", "query_offset", "lengths", "sink_token_length", "attention_chunk",
                "key_leftpad")


@property_test(requires=differentiable_with(*KEY_CHOOSING), covering_set="brief")
@sdpa_op
@given(case=variant_gradient_cases(variants=KEY_CHOOSING, required=KEY_CHOOSING, clauses=("grad.variants",),
                                   mask_kinds=("none", "bool-full", "key-padding")))
def test_variant_gradients(impl, device, dtype, case):
    """Windows, offsets, chunks, sink tokens, key lengths, left padding (removed keys take no gradient) and ALiBi (a
    constant bias inside P)."""
    check_variant_gradients(impl, device, dtype, case)


@property_test(requires=differentiable_with("learnable_sink"), covering_set="brief")
@sdpa_op
@given(case=variant_gradient_cases(variants=("learnable_sink", "softcap", "window", "alibi_slopes", "lengths",
                                             "attention_chunk"), required=("learnable_sink",),
                                   clauses=("grad.learnable-sink",), mask_kinds=("none", "float")))
def test_learnable_sink_gradients(impl, device, dtype, case):
    """dsink = -sum_b sum_i P_sink (dO . O) per query head, and dq, dk, dv with the sink in the normaliser."""
    check_variant_gradients(impl, device, dtype, case, order=("dsink", "dq", "dk", "dv", "dmask"))


@property_test(requires=differentiable_with(*KEY_CHOOSING, "softcap", "learnable_sink"), covering_set="pairwise",
               pairs_of="gradients")
@sdpa_op
@given(case=gradient_pair_cases())
def test_every_pair_of_variant_gradients(impl, device, dtype, case):
    """The backward through every two variant keywords, the causal flag and grouped heads (conformance/cases/
    pairwise.py): a pair's corner at keyword values drawn as their own gradient properties draw them."""
    check_variant_gradients(impl, device, dtype, case)

"""Gradients of sdpa against the float64 analytic backward (clauses grad.*).

For implementations whose ARRAY is "torch" or "jax", dL/dq, dL/dk, dL/dv and, for
an additive float mask, dL/dmask are obtained with the framework's autodiff for a
random upstream gradient dO (conformance/judging/gradients.py) and compared with
conformance/reference/backward.py under the ``sdpa_backward`` tolerance model of
spec/tolerances.yaml. The forward output of the same call is judged first
(sdpa.definition), so a gradient verdict is never about a wrong forward.

When dK or dV disagree on a grouped-query case, the test asks the implementation
again with the kv heads repeated to Hq (no GQA): if those per-head gradients
agree, the fault is the sum over the group (grad.gqa-sum); otherwise it is the
per-head backward itself (grad.sdpa-k / grad.sdpa-v).
"""
from __future__ import annotations

import pytest
from hypothesis import given

from attention_conformance.conformance.cases.drawing import DerivedCase
from attention_conformance.conformance.cases.gradients import gradient_cases
from attention_conformance.conformance.harness.checks import gradient_judge_for, without_autodiff
from attention_conformance.conformance.harness.properties import UNLESS_COMPILED, property_test
from attention_conformance.conformance.judging.gradient_verdicts import judge_gradients

pytestmark = pytest.mark.conformance


sdpa_op = pytest.mark.op("sdpa")


# A new shape costs JAX a compile of forward and backward, about 1 s on the CI machine
# (five times the forward alone): JAX implementations run a tenth of the profile's
# examples, at least one (property_test).
gradient_test = property_test(requires=without_autodiff, covering_set="brief")



# ----------------------------------------------------------------------- tests
@gradient_test
@sdpa_op
@given(case=gradient_cases(gqa=False, clauses=("grad.sdpa-q",)))
def test_sdpa_gradients(impl, device, dtype, case):
    """dq, dk, dv (and dmask for float masks) over every mask kind, causal flag, scale and magnitude."""
    judge = gradient_judge_for(impl, device, dtype)
    judge_gradients(judge, case, case.rounded(dtype))


# Kernel-shaped corners past a query block of 128 rows for an implementation that does not compile per signature,
# the second (Lq > Lk, mask index 1) a key-padding mask: a backward that ran its queries in blocks of 64 and wrote a
# mask's gradient row shared by every query (query axis 1) per block, the last block's overwriting the others', passed
# a default run whose gradient corners had at most 7 rows.
@property_test(requires=without_autodiff, covering_set="brief", kernel_corners=UNLESS_COMPILED,
               derives=(DerivedCase("makes every mask an additive float mask", sets={"mask_kind": "float"}),))
@sdpa_op
@given(case=gradient_cases(mask_kinds=("float", "key-padding", "float-large", "bool-2d", "per-head",
                                       "bool-query-keys"), float_masks_from_bool=True, allow_empty_rows=True,
                           clauses=("grad.mask",)))
def test_float_mask_gradient(impl, device, dtype, case):
    """dL/dmask of an additive mask in every broadcast shape: dS summed over the broadcast axes."""
    judge = gradient_judge_for(impl, device, dtype)
    judge_gradients(judge, case, case.rounded(dtype), order=("dmask", "dq", "dk", "dv"))


@gradient_test
@sdpa_op
@given(case=gradient_cases(mask_kinds=("none", "key-padding", "per-head", "float"), clauses=("grad.gqa-sum",)).filter(
    lambda c: c.inputs["q"].shape[1] > c.inputs["k"].shape[1]))
def test_gqa_gradient_sum(impl, device, dtype, case):
    """Grouped-query attention: dk and dv sum over the query heads sharing each kv head."""
    judge = gradient_judge_for(impl, device, dtype)
    judge_gradients(judge, case, case.rounded(dtype), order=("dk", "dv", "dq", "dmask"))

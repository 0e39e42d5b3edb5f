"""The 16-bit tolerance counts an operand rounded before the product (spec/tolerances.yaml, sixteen_bit, c_operand).

Hugging Face's BART and Whisper, and Flax's dot_product_attention, scale the query in the input dtype before Q K^T.
That rounding moves a score by up to u |scale| sum_d |q_d k_d|: where q . k cancels, far more than the score's own
rounding (u |scale q . k|), which was all the model counted. A correct implementation failed at 4.2x.
"""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import tolerances
from attention_conformance.implementations.registry import load_implementation

pytestmark = pytest.mark.selfcheck

# q . k_0 = 13 * 11 - 11 * 13 = 0; both scores 0 exactly, yet q * (1 / sqrt 2) rounded to bfloat16 moves the first
CANCELLING = {"q": np.array([[[[13.0, 11.0]]]]), "k": np.array([[[[11.0, -13.0], [0.0, 0.0]]]]),
              "v": np.array([[[[1.0], [-1.0]]]])}


def cancelling_case() -> Case:
    return Case("sdpa", dict(CANCELLING), ("sdpa.definition",), "B1 Hq1/Hkv1 Lq1 Lk2 Dk2 Dv1 mask=none scale=None "
                "(hand-made: q . k0 = 0 by cancellation)")


def without_operand_term():
    constants = dict(tolerances._sixteen_bit_constants(), c_operand=0.0)
    return mock.patch.object(tolerances, "_sixteen_bit_constants", lambda: constants)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_query_scaled_in_the_dtype_passes_where_q_dot_k_cancels(dtype):
    Judge(load_implementation("zoo.correct_prescaled_query"), dtype, "cpu").check(cancelling_case())


def test_without_the_operand_term_the_same_case_failed_a_correct_implementation():
    judge = Judge(load_implementation("zoo.correct_prescaled_query"), "bfloat16", "cpu")
    with without_operand_term(), pytest.raises(ConformanceFailure, match="sdpa.definition"):
        judge.check(cancelling_case())


def test_the_operand_term_widens_the_allowance_where_q_dot_k_cancels_and_adds_nothing_at_scale_zero():
    q, k, v = CANCELLING["q"], CANCELLING["k"], CANCELLING["v"]
    with_term = tolerances.sdpa_allowed(q, k, v, None, False, None, "bfloat16")
    with without_operand_term():
        without = tolerances.sdpa_allowed(q, k, v, None, False, None, "bfloat16")
        at_zero = tolerances.sdpa_allowed(q, k, v, None, False, 0.0, "bfloat16")
    assert with_term.item() > 4 * without.item()
    assert tolerances.sdpa_allowed(q, k, v, None, False, 0.0, "bfloat16").item() == at_zero.item()


# q's entries 15 and 31 each repeated 24 times (two significands): q * scale rounds every copy alike, so within each
# group the score's error adds linearly; k_0 puts +465 and -465 per copy on the two groups, so q . k_0 = 0.
REPEATED = {"q": np.array([[[[15.0] * 24 + [31.0] * 24]]]), "k": np.array([[[[31.0] * 24 + [-15.0] * 24, [0.0] * 48]]]),
            "v": np.array([[[[1.0], [-1.0]]]])}


def repeated_case() -> Case:
    return Case("sdpa", dict(REPEATED), ("sdpa.definition",), "B1 Hq1/Hkv1 Lq1 Lk2 Dk48 Dv1 mask=none scale=None "
                "(hand-made: q's entries repeated, q . k0 = 0 by cancellation)")


def test_the_entries_sharing_a_significand_are_counted_as_one_rounding_each_group():
    q = np.array([[15.0, 15.0, 31.0, 31.0, 31.0, 0.0, 0.0, 7.5, -15.0], [1, 2, 3, 4, 5, 6, 7, 8, 9]])
    sizes = tolerances.operand_group_sizes(q, 2.0**-11)
    assert sizes.tolist() == [[4, 4, 3, 3, 3, 2, 2, 4, 4], [4, 4, 2, 4, 1, 2, 1, 4, 1]]
    # bfloat16 keeps 8 significand bits: 1 + 2^-7 is a significand of its own, 1 + 2^-9 is not a bfloat16 value
    assert tolerances.operand_group_sizes(np.array([[1.0078125, 1.0, 2.0]]), 2.0**-8).tolist() == [[1, 2, 2]]


def test_a_query_with_repeated_entries_scaled_in_the_dtype_passes():
    """float16, zoo/correct_prescaled_query: 2.03x over the allowance when the model took every q_d's rounding as
    independent (a random walk over d)."""
    Judge(load_implementation("zoo.correct_prescaled_query"), "float16", "cpu").check(repeated_case())


def test_without_the_groups_the_repeated_entries_failed_a_correct_implementation():
    judge = Judge(load_implementation("zoo.correct_prescaled_query"), "float16", "cpu")
    ungrouped = mock.patch.object(tolerances, "operand_group_sizes", lambda x, u: np.ones(x.shape))
    with ungrouped, pytest.raises(ConformanceFailure, match="sdpa.definition"):
        judge.check(repeated_case())

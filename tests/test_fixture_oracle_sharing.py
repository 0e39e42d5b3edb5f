"""A fixture's oracle output and allowed error are computed once per worker and shared by every implementation that
judges it (conformance/judging.py, _shared_for_fixture): the same values as computed afresh, a case whose inputs
differ gets its own, and no verdict can write into them."""
from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.conformance.cases.fixtures import fixtures
from attention_conformance.conformance.judging import verdict
from attention_conformance.conformance.judging.expected import allowed_error, expected_output
from attention_conformance.conformance.judging.fixtures import fixture_case
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.implementations.registry import load_implementation


def masked_sdpa_fixture():
    return next(fx for fx in fixtures() if fx.op == "sdpa" and fx.inputs.get("mask") is not None)


@pytest.fixture
def empty_store(monkeypatch):
    monkeypatch.setattr(verdict, "_FIXTURE_ORACLE", {})


def test_two_implementations_share_the_fixtures_oracle_and_allowance(empty_store):
    case = fixture_case(masked_sdpa_fixture())
    inputs = case.rounded("float32")
    first, second = (Judge(load_implementation(f"builtin:{name}"), "float32", "cpu")
                     for name in ("numpy_native", "torch_math"))
    want = first._expected(case, inputs, "zeros")
    assert second._expected(case, case.rounded("float32"), "zeros") is want  # the second judge computes nothing
    np.testing.assert_array_equal(want, expected_output(case, inputs, "zeros", first.alignment))
    allowed = first.allowed(case, inputs)
    assert second.allowed(case, case.rounded("float32")) is allowed
    np.testing.assert_array_equal(allowed, allowed_error(case, inputs, "float32", "zeros"))
    assert len(verdict._FIXTURE_ORACLE) == 2


def test_other_inputs_policies_and_dtypes_are_entries_of_their_own(empty_store):
    case = fixture_case(masked_sdpa_fixture())
    judge = Judge(load_implementation("builtin:numpy_native"), "float32", "cpu")
    inputs = case.rounded("float32")
    want = judge._expected(case, inputs, "zeros")
    changed = dict(inputs, q=inputs["q"] * 2)  # a probe derived from the fixture keeps its notes, not its values
    np.testing.assert_array_equal(judge._expected(case, changed, "zeros"),
                                  expected_output(case, changed, "zeros", judge.alignment))
    assert not np.array_equal(judge._expected(case, changed, "zeros"), want)
    assert judge._expected(case, inputs, "uniform") is not want
    wide = Judge(load_implementation("builtin:numpy_native"), "float64", "cpu")
    assert wide.allowed(case, case.rounded("float64")) is not judge.allowed(case, inputs)
    assert len(verdict._FIXTURE_ORACLE) == 5


def test_a_shared_value_cannot_be_changed_by_a_verdict(empty_store):
    case = fixture_case(masked_sdpa_fixture())
    want = Judge(load_implementation("builtin:numpy_native"), "float32", "cpu")._expected(
        case, case.rounded("float32"), "zeros")
    with pytest.raises(ValueError, match="read-only"):
        want[...] = 0.0

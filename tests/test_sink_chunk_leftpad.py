"""How the suite handles the sink, chunk and left-padding keywords (README "The contract"; spec/clauses.yaml
sdpa.learnable-sink ... sdpa.key-leftpad): they reach an implementation in the contract's dtypes and only when used, a
row without keys is 0 with a sink whatever FULLY_MASKED_ROWS says, the sink's tolerance term only adds, and each
feature's bug is filed under its clause with a repro that shows it."""
from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import oracle, tolerances
from attention_conformance.implementations.registry import load_implementation
from zoo import correct_sink_chunk_leftpad_reference as reference

from .test_variant_judging import filed_under_and_reproduced

# kept_records: these judges record cases that the session's own summary and report must not count.
pytestmark = [pytest.mark.selfcheck, pytest.mark.usefixtures("kept_records")]


def case_with(clause: str = "sdpa.learnable-sink", **extra) -> Case:
    rng = np.random.default_rng(11)
    inputs = {"q": rng.standard_normal((2, 2, 4, 3)), "k": rng.standard_normal((2, 1, 6, 3)),
              "v": rng.standard_normal((2, 1, 6, 3)), **extra}
    return Case("sdpa", inputs, (clause,), f"case for {clause}")


class Recorder:
    """The reference member, remembering the keywords it was given."""

    DTYPES = reference.DTYPES
    seen: dict = {}

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, query_offset=0, window=None,
             learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
        cls.seen = dict(learnable_sink=learnable_sink, sink_token_length=sink_token_length,
                        attention_chunk=attention_chunk, key_leftpad=key_leftpad)
        return reference.sdpa(q, k, v, mask, is_causal, scale, query_offset=query_offset, window=window,
                              learnable_sink=learnable_sink, sink_token_length=sink_token_length,
                              attention_chunk=attention_chunk, key_leftpad=key_leftpad)


class NanRowsWithoutKeys(Recorder):
    """Declares FULLY_MASKED_ROWS = "nan" and returns NaN on every row without keys, also beside a sink."""

    FULLY_MASKED_ROWS = "nan"

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, key_leftpad=None, learnable_sink=None):
        out = reference.sdpa(q, k, v, mask, is_causal, scale, key_leftpad=key_leftpad, learnable_sink=learnable_sink)
        empty = oracle.fully_masked_rows(q, k, mask, is_causal, key_leftpad=key_leftpad)
        return np.where(empty[..., None], np.nan, out)


@pytest.mark.parametrize("dtype, sink_dtype", [("float16", np.float32), ("bfloat16", np.float32),
                                                ("float32", np.float32), ("float64", np.float64)])
def test_keywords_reach_the_implementation_in_the_contracts_dtypes(dtype, sink_dtype):
    case = case_with(is_causal=True, query_offset=2, window=(2, 0), learnable_sink=np.array([0.5, -1.0]),
                     sink_token_length=1, attention_chunk=3, key_leftpad=np.array([1, 0]))
    Judge(load_implementation("tests.test_sink_chunk_leftpad:Recorder"), dtype, "cpu").check(case)
    seen = Recorder.seen
    assert seen["learnable_sink"].dtype == sink_dtype and seen["key_leftpad"].dtype == np.int32
    assert seen["sink_token_length"] == 1 and seen["attention_chunk"] == 3


def test_default_keywords_are_not_passed():
    case = case_with(sink_token_length=0, attention_chunk=None, learnable_sink=None, key_leftpad=None)
    assert oracle.variant_options(case.inputs) == {}
    Judge(load_implementation("tests.test_sink_chunk_leftpad:Recorder"), "float64", "cpu").check(case)
    assert Recorder.seen == dict(learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None)


def test_a_signature_without_the_keyword_is_unsupported_not_failed():
    impl = load_implementation("zoo.correct_sink_lse_rescale")  # learnable_sink only
    inputs = case_with(key_leftpad=np.array([1, 0])).rounded("float64")
    assert "key_leftpad" in impl.unsupported_reason("sdpa", inputs, "float64", "cpu")


def test_a_row_without_keys_is_zero_with_a_sink_whatever_the_declared_policy():
    """sdpa.learnable-sink: the sink takes the whole row (no 0/0), so 'nan' does not apply there; without a sink the
    declared policy does."""
    impl = load_implementation("tests.test_sink_chunk_leftpad:NanRowsWithoutKeys")
    judge = Judge(impl, "float64", "cpu")
    judge.check(case_with(key_leftpad=np.array([6, 0]), clause="sdpa.key-leftpad"))  # example 0: no key, NaN declared
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case_with(key_leftpad=np.array([6, 0]), learnable_sink=np.array([0.0, 1.0])))
    assert raised.value.clause == "sdpa.finite"  # NaN where the contract gives 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_sink_term_only_adds_and_rows_without_keys_are_exact(dtype):
    """spec/tolerances.yaml, variants (c_sink): a sink far below every score leaves the output and (up to the sink's
    own vanishing term) the allowance as they were; rows without keys are allowed exactly 0."""
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 1, 6, 4)), rng.standard_normal((1, 1, 6, 4))
    plain = tolerances.sdpa_allowed(q, k, v, None, False, None, dtype)
    far_below = tolerances.sdpa_allowed(q, k, v, None, False, None, dtype, learnable_sink=np.array([-60.0, -60.0]))
    assert (far_below >= plain).all() and np.allclose(far_below, plain, rtol=0.05)
    above = tolerances.sdpa_allowed(q, k, v, None, False, None, dtype, learnable_sink=np.array([3.0, 3.0]))
    assert np.isfinite(above).all() and (above > 0).all()
    mask = np.ones((1, 1, 3, 6), dtype=bool)
    mask[..., 1, :] = False  # row 1 has no key
    with_sink = tolerances.sdpa_allowed(q, k, v, mask, False, None, dtype, "nan", learnable_sink=np.array([0.0, 1.0]))
    assert (np.broadcast_to(with_sink, (1, 2, 3, 4))[:, :, 1] == 0).all()
    assert np.array_equal(oracle.sdpa(q, k, v, mask, learnable_sink=np.array([0.0, 1.0]),
                                      fully_masked_rows_policy="nan")[:, :, 1], np.zeros((1, 2, 4)))


@pytest.mark.parametrize("member, options, clause", [
    ("broken_sink_added_to_scores", {"learnable_sink": np.array([1.0, 0.0])}, "sdpa.learnable-sink"),
    ("broken_sink_takes_value", {"learnable_sink": np.array([1.0, 0.0])}, "sdpa.learnable-sink"),
    ("broken_chunk_query_off_by_one", {"is_causal": True, "query_offset": 1, "attention_chunk": 2},
     "sdpa.attention-chunk"),
    ("broken_leftpad_causal_shift", {"is_causal": True, "query_offset": 2, "key_leftpad": np.array([2, 1])},
     "sdpa.key-leftpad"),
    ("broken_sink_tokens_past_right_edge", {"window": (0, 0), "sink_token_length": 3}, "sdpa.sink-tokens"),
])
def test_a_bug_is_filed_under_its_clause_and_the_repro_shows_it(member, options, clause):
    filed_under_and_reproduced(member, case_with(clause, **options), clause)

"""How the judge handles the variant keywords (README "The contract"): padding rows are not judged,
a missing keyword is unsupported, the keywords reach the implementation in the contract's dtypes, and a
variant bug is filed under its clause with a repro that shows it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.harness import checks
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.registry import from_object, load_implementation
from zoo import correct_variants_reference as reference

# kept_records: these judges record cases that the session's own summary and report must not count.
pytestmark = [pytest.mark.selfcheck, pytest.mark.usefixtures("kept_records")]
ROOT = Path(__file__).resolve().parents[1]


def varlen_case(**extra) -> Case:
    rng = np.random.default_rng(3)
    inputs = {"q": rng.standard_normal((2, 2, 4, 3)), "k": rng.standard_normal((2, 1, 5, 3)),
              "v": rng.standard_normal((2, 1, 5, 3)), "query_lengths": np.array([4, 1]),
              "key_lengths": np.array([5, 2]), **extra}
    return Case("sdpa", inputs, ("sdpa.varlen",), "padded batch")


class PaddingGarbage:
    """Correct on the rows it is judged on; NaN, inf and nonsense in padding rows (or, with ``leak``, one judged row)."""

    def __init__(self, leak: bool = False):
        self.leak = leak

    def sdpa(self, q, k, v, mask=None, is_causal=False, scale=None, *, query_lengths=None, key_lengths=None):
        out = reference.sdpa(q, k, v, mask, is_causal, scale, query_lengths=query_lengths, key_lengths=key_lengths)
        out[1, :, 1] = np.nan  # example 1 has one query: rows 1.. are padding
        out[1, :, 2] = np.inf
        out[1, :, 3] = 1e9
        if self.leak:
            out[1, 0, 0] = np.nan  # a judged row
        return out


def test_padding_rows_are_not_judged():
    judge = Judge(load_implementation("tests.test_variant_judging:PaddingGarbage"), "float64", "cpu")
    record = judge.check(varlen_case())[0]
    assert np.isnan(record[1, :, 1]).all()  # what the implementation returned is kept, only not judged


def test_a_judged_row_is_still_checked():
    module = sys.modules[__name__]
    module.PaddingLeak = PaddingGarbage(leak=True)
    judge = Judge(load_implementation("tests.test_variant_judging:PaddingLeak"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(varlen_case())
    assert raised.value.clause == "sdpa.finite"


def test_judged_rows_and_fully_masked_rows():
    q = np.zeros((2, 1, 3, 1))
    assert oracle.judged_rows(q, np.array([3, 1])).tolist() == [[[True, True, True]], [[True, False, False]]]
    empty = oracle.fully_masked_rows(q, np.zeros((2, 1, 4, 1)), key_lengths=np.array([4, 0]))
    assert empty.tolist() == [[[False] * 3], [[True] * 3]]


def test_an_implementation_without_the_keyword_is_unsupported_not_failed():
    judge = Judge(load_implementation("zoo.correct_reference"), "float64", "cpu")
    with pytest.raises(pytest.skip.Exception, match="has no '(query|key)_lengths' parameter"):
        judge.run(varlen_case())


class Recorder:
    """Records the type and dtype of every variant keyword it gets."""

    seen: dict = {}
    DTYPES = ("float64", "float32", "float16", "bfloat16")

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None):
        cls.seen = {name: value for name, value in dict(window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                                        query_offset=query_offset, query_lengths=query_lengths,
                                                        key_lengths=key_lengths).items()}
        return reference.sdpa(q, k, v, mask, is_causal, scale, window=window, softcap=softcap,
                              alibi_slopes=alibi_slopes, query_offset=query_offset, query_lengths=query_lengths,
                              key_lengths=key_lengths)


@pytest.mark.parametrize("dtype, slopes_dtype", [("float16", np.float32), ("float32", np.float32),
                                                 ("float64", np.float64)])
def test_keywords_reach_the_implementation_in_the_contracts_dtypes(dtype, slopes_dtype):
    case = varlen_case(window=(2, None), softcap=3.0, alibi_slopes=np.array([0.5, 0.25]), query_offset=1)
    Judge(load_implementation("tests.test_variant_judging:Recorder"), dtype, "cpu").check(case)
    seen = Recorder.seen
    assert seen["window"] == (2, None) and seen["softcap"] == 3.0 and seen["query_offset"] == 1
    assert seen["alibi_slopes"].dtype == slopes_dtype
    assert seen["query_lengths"].dtype == np.int32 and seen["key_lengths"].dtype == np.int32


def test_default_keywords_are_not_passed():
    case = varlen_case()
    case.inputs.update(window=None, query_offset=0)
    Judge(load_implementation("tests.test_variant_judging:Recorder"), "float64", "cpu").check(case)
    assert Recorder.seen["window"] is None and Recorder.seen["query_offset"] == 0


@pytest.mark.parametrize("member, options, clause", [
    ("broken_variant_window_exclusive_right", {"window": (1, 1)}, "sdpa.window"),
    ("broken_variant_causal_ignores_offset", {"is_causal": True, "query_offset": 3}, "sdpa.query-offset"),
    ("broken_variant_key_lengths_ignored", {}, "sdpa.varlen"),
])
def test_a_variant_bug_is_filed_under_its_clause_and_the_repro_shows_it(member, options, clause):
    case = varlen_case(**options)
    filed_under_and_reproduced(member, Case("sdpa", case.inputs, (clause,), case.label), clause)


def filed_under_and_reproduced(member: str, case: Case, clause: str) -> None:
    """The zoo member fails ``case`` under ``clause``, and the failure's repro, run alone, shows the error."""
    judge = Judge(load_implementation(f"zoo.{member}"), "float32", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    assert raised.value.clause == clause
    snippet = judge._snippet(case, case.rounded("float32"))
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    error = float(result.stdout.split("max abs error")[1].split()[0])
    assert error > 1e-3, result.stdout


def test_the_correct_member_passes_the_same_cases():
    judge = Judge(load_implementation("zoo.correct_variants_reference"), "float32", "cpu")
    for options in ({"window": (1, 1)}, {"is_causal": True, "query_offset": 3}, {}):
        judge.check(varlen_case(**options))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_variant_tolerance_terms_only_add(dtype):
    """spec/tolerances.yaml, variants: softcap and ALiBi add per-score terms; windows, offsets and lengths add none,
    and a case without variants keeps exactly the allowance it had."""
    from attention_conformance.conformance.reference import tolerances

    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 1, 6, 4)), rng.standard_normal((1, 1, 6, 4))
    plain = tolerances.sdpa_allowed(q, k, v, None, False, None, dtype)
    assert np.array_equal(plain, tolerances.sdpa_allowed(q, k, v, None, False, None, dtype, query_offset=0))
    capped = tolerances.sdpa_allowed(q, k, v, None, False, None, dtype, softcap=1e6)  # ~ no-op: only the rounding
    assert (capped >= plain).all() and (capped > plain).any()
    biased = tolerances.sdpa_allowed(q, k, v, None, False, None, dtype, alibi_slopes=np.array([0.0, 0.0]))
    assert np.allclose(biased, plain)  # zero slopes: a zero bias, nothing to round


class _KeyLengthsInclusive:
    """sdpa whose key_lengths keep key j == length too (j <= L instead of j < L); every other keyword right."""

    ARRAY = "numpy"
    DTYPES = ("float64",)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, key_lengths=None, learnable_sink=None):
        lengths = None if key_lengths is None else np.minimum(np.asarray(key_lengths) + 1, k.shape[2])
        return oracle.sdpa(q, k, v, mask, is_causal, scale, key_lengths=lengths, learnable_sink=learnable_sink)


def test_a_variant_bug_in_a_case_drawn_for_another_variant_is_filed_under_its_own_clause():
    """A case of test_learnable_sink_joins_after_the_other_variants carries key_lengths too: it passes without them,
    so the fault is sdpa.varlen's (it was filed under sdpa.learnable-sink, the case's own clause)."""
    rng = np.random.default_rng(3)
    inputs = {"q": rng.standard_normal((1, 2, 3, 4)), "k": rng.standard_normal((1, 2, 6, 4)),
              "v": rng.standard_normal((1, 2, 6, 4)), "key_lengths": np.array([3], np.int32),
              "learnable_sink": np.array([0.5, -1.0])}
    case = Case("sdpa", inputs, ("sdpa.learnable-sink",), "B1 Hq2/Hkv2 Lq3 Lk6 key_lengths=[3] sink (hand-made)")
    judge = Judge(from_object(_KeyLengthsInclusive, "key_lengths_inclusive", "tests:key_lengths_inclusive"),
                  "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    assert raised.value.clause == "sdpa.varlen", str(raised.value)


def test_a_property_about_one_keyword_needs_that_keyword_alone():
    """An sdpa with alibi_slopes and no query_offset (jax_dpa's window and slopes, many kernels' ALiBi) is judged by
    the ALiBi and window properties at offset 0, not skipped for the missing offset. The
    combined-order property needs two variant keywords the implementation runs."""
    from attention_conformance.conformance.cases.variants import VARIANTS

    alibi_only = load_implementation("zoo.broken_alibi_gqa_head_order")
    assert checks.needs_keywords("alibi_slopes")(alibi_only) is None
    assert "query_offset" in checks.needs_keywords("alibi_slopes", "query_offset")(alibi_only)
    assert "fewer than 2" in checks.needs_keywords(combined=VARIANTS, at_least=2)(alibi_only)
    assert checks.needs_keywords("window")(load_implementation("builtin:jax_dpa")) is None
    assert checks.needs_keywords(combined=VARIANTS, at_least=2)(load_implementation("builtin:torch_sdpa")) is None

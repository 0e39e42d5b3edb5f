"""SUPPORTS["causal"] = "only": a kernel that runs causal attention alone (gpt-oss's Triton attention masks every key
past the query's position and has no flag to turn that off).

Its cases are drawn causal (sdpa, multi-head attention, packed batches); a property that holds is_causal off, or whose
second case drops it, is skipped as unsupported, never failed; a non-causal case met elsewhere (a fixture) is
unsupported. The stand-in raises on any non-causal call, so a clean run shows that the suite never made one.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from attention_conformance.conformance import test_mha, test_properties, test_varlen
from attention_conformance.conformance.cases.drawing import drawing_inside
from attention_conformance.conformance.cases.mha import mha_cases
from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.cases.sequences import varlen_cases
from attention_conformance.implementations.region import RegionError, parse_region
from attention_conformance.implementations.registry import from_object

from zoo import _reference as ref
from zoo import correct_sink_chunk_leftpad_reference as chunked
from zoo import correct_varlen_paged_reference as sequences

from .battery import run_battery

pytestmark = pytest.mark.selfcheck


def _refuse_non_causal(op: str, is_causal: bool) -> None:
    if not is_causal:
        raise ValueError(f"{op} runs causal attention only: called with is_causal=False")


class CausalOnly:
    """gpt-oss's attention kernel as a contract stand-in: causal always, with its window and sinks."""

    DTYPES = ("float64",)
    SUPPORTS = {"causal": "only"}
    CALLS: list = []

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, query_offset=0, learnable_sink=None):
        _refuse_non_causal("sdpa", is_causal)
        CausalOnly.CALLS.append("sdpa")
        return chunked.attend(q, k, v, mask, is_causal, scale, window=window, query_offset=query_offset,
                              learnable_sink=learnable_sink)

    @staticmethod
    def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
        _refuse_non_causal("multi_head_attention", is_causal)
        CausalOnly.CALLS.append("multi_head_attention")
        return ref.multi_head_attention(query, key, value, params, num_heads, mask, is_causal)

    @staticmethod
    def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None):
        _refuse_non_causal("sdpa_varlen", is_causal)
        CausalOnly.CALLS.append("sdpa_varlen")
        return sequences.sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale)


def test_the_declaration_parses_and_says_why_a_case_is_outside():
    region = parse_region({"causal": "only"})
    assert region.causal and region.causal_only and region.describe()["causal"] == "only"
    assert region.why_outside({"op": "sdpa", "is_causal": False}) == "is_causal=False (declared causal: 'only')"
    assert region.why_outside({"op": "sdpa", "is_causal": True}) is None
    assert region.why_outside({"op": "sdpa"}) is None  # a partial set without the flag
    for older in (True, False, "lq<=lk"):
        assert not parse_region({"causal": older}).causal_only
    with pytest.raises(RegionError, match=r"must be True, False, 'only' \(causal cases only\) or one of"):
        parse_region({"causal": "always"})


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(sdpa_case=sdpa_cases(), mha_case=mha_cases(), varlen_case=varlen_cases())
def _draw_every_operation(sdpa_case, mha_case, varlen_case):
    for case in (sdpa_case, mha_case, varlen_case):
        assert case.inputs.get("is_causal") is True, case.label


def test_every_generated_case_is_causal():
    with drawing_inside(parse_region({"causal": "only"})):
        _draw_every_operation()


def _outcome(test, impl) -> str:
    """One property on ``impl`` in float64 (derandomized, 5 examples): "passed", or "skipped: <reason>"."""
    inner = test.__wrapped__
    base = inner._hypothesis_internal_use_settings
    inner._hypothesis_internal_use_settings = settings(
        base, max_examples=5, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck))
    try:
        test(impl=impl, device="cpu", dtype="float64")
    except pytest.skip.Exception as skipped:
        return f"skipped: {skipped}"
    finally:
        inner._hypothesis_internal_use_settings = base
    return "passed"


@pytest.mark.parametrize("test, outcome", [
    (test_properties.test_sdpa_matches_oracle, "passed"),
    (test_properties.test_causal_top_left, "passed"),
    (test_mha.test_mha_matches_oracle, "passed"),
    (test_varlen.test_varlen_matches_oracle, "passed"),
    # Properties that hold is_causal off: no case lies inside.
    (test_properties.test_bool_mask, "skipped: unsupported: "),
    (test_mha.test_mha_head_split, "skipped: unsupported: "),
    # The key permutation compares with the same case without is_causal: its second case leaves the region.
    (test_properties.test_key_permutation, "skipped: derived case leaves the region: "),
], ids=lambda value: getattr(value, "__name__", value))
def test_a_causal_only_kernel_skips_what_needs_non_causal_cases(kept_records, test, outcome):
    impl = from_object(CausalOnly, "causal_only", "tests.test_causal_only:CausalOnly")
    CausalOnly.CALLS.clear()
    got = _outcome(test, impl)
    assert got.startswith(outcome), got
    if outcome == "passed":
        assert CausalOnly.CALLS, "nothing was called"
    else:
        assert "is_causal=False (declared causal: 'only')" in got, got


def test_a_causal_only_kernel_passes_the_suite(kept_records):
    """Every fixture and property: no failure (a non-causal call would have raised), some judged."""
    impl = from_object(CausalOnly, "causal_only", "tests.test_causal_only:CausalOnly")
    verdicts = run_battery(impl, dtypes=("float64",), max_examples=3, brief=True)
    assert not verdicts.errors, verdicts.errors[:3]
    assert not verdicts.failures, verdicts.failures[:5]
    assert verdicts.passed > 0

"""facts["variants"] and facts["variant_values"] for every operation, read by supports(facts) and KNOWN_DEVIATIONS.

The names stay what they were (a sorted tuple: ``"window" in facts["variants"]``); the values come beside them.
Stand-ins (NumPy) of two real kernels declare their region through the values: FlashAttention's local attention,
which runs only left windows (W, 0), and a kernel that places queries bottom-right only (query_offset = Lk - Lq, as
FlashAttention's causal band and window do). Each refuses, by raising, any call outside what it declares, so a pass
shows that the suite drew inside it.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

from attention_conformance.conformance import test_variants
from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.harness.sequence_parallel import region_facts
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.implementations.region import shape_facts
from attention_conformance.implementations.registry import from_object, load_implementation

from zoo import correct_sink_chunk_leftpad_reference as chunked

from . import battery

pytestmark = pytest.mark.selfcheck

RNG = np.random.default_rng(5)


def _sdpa_inputs(lq=4, lk=6, **variants) -> dict:
    return {"q": RNG.standard_normal((2, 3, lq, 4)), "k": RNG.standard_normal((2, 1, lk, 4)),
            "v": RNG.standard_normal((2, 1, lk, 4)), **variants}


# ------------------------------------------------------------------ the facts of each operation
def test_sdpa_facts_keep_the_names_and_add_the_values():
    inputs = _sdpa_inputs(window=(3, 0), query_offset=2, softcap=np.float64(30.0), key_lengths=np.array([6, 2]),
                          alibi_slopes=np.full((2, 3), 0.5), learnable_sink=np.zeros(3, np.float32),
                          attention_chunk=4, sink_token_length=1, key_leftpad=np.array([0, 1], np.int32))
    facts = shape_facts("sdpa", inputs)
    names = ("alibi_slopes", "attention_chunk", "key_leftpad", "key_lengths", "learnable_sink", "query_offset",
             "sink_token_length", "softcap", "window")
    assert facts["variants"] == names and "window" in facts["variants"] and list(facts["variants"]) == list(names)
    assert facts["variant_values"] == {
        "alibi_slopes": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), "attention_chunk": 4, "key_leftpad": (0, 1),
        "key_lengths": (6, 2), "learnable_sink": (0.0, 0.0, 0.0), "query_offset": 2, "sink_token_length": 1,
        "softcap": 30.0, "window": (3, 0)}
    assert tuple(facts["variant_values"]) == facts["variants"]
    assert type(facts["variant_values"]["softcap"]) is float and type(facts["variant_values"]["key_lengths"][0]) is int
    assert facts["query_offset_is_bottom_right"] is True  # 2 = Lk - Lq
    plain = shape_facts("sdpa", _sdpa_inputs(lq=4, lk=4, window=(None, 1)))
    assert plain["variants"] == ("window",) and plain["variant_values"] == {"window": (None, 1)}
    assert plain["query_offset_is_bottom_right"] is True  # Lq == Lk at offset 0
    assert shape_facts("sdpa", _sdpa_inputs())["query_offset_is_bottom_right"] is False  # top-left, Lq < Lk
    assert shape_facts("sdpa", _sdpa_inputs(query_offset=0))["variants"] == ()  # a default is not passed


def test_multi_head_attention_facts_have_the_values_per_head():
    params = {"w_q": np.zeros((8, 6)), "w_k": np.zeros((8, 6)), "w_v": np.zeros((8, 6)), "w_o": np.zeros((6, 8))}
    facts = shape_facts("multi_head_attention", {"query": np.zeros((1, 3, 8)), "key": np.zeros((1, 5, 8)),
                                                 "value": np.zeros((1, 5, 8)), "params": params, "num_heads": 2,
                                                 "window": (4, 0), "query_offset": 2})
    assert facts["variants"] == ("query_offset", "window")
    assert facts["variant_values"] == {"query_offset": 2, "window": (4, 0)}
    assert facts["query_offset_is_bottom_right"] is True


def _varlen_inputs(**variants) -> dict:
    return {"q": RNG.standard_normal((5, 2, 4)), "k": RNG.standard_normal((7, 1, 4)),
            "v": RNG.standard_normal((7, 1, 4)),
            "cu_seqlens_q": np.array([0, 2, 5], np.int32), "cu_seqlens_k": np.array([0, 3, 7], np.int32),
            "max_seqlen_q": 3, "max_seqlen_k": 4, **variants}


def _paged_inputs(**variants) -> dict:
    return {"q": RNG.standard_normal((2, 2, 3, 4)), "k_cache": RNG.standard_normal((4, 2, 1, 4)),
            "v_cache": RNG.standard_normal((4, 2, 1, 4)), "block_table": np.array([[0, 1], [2, 3]], np.int32),
            "seqused_k": np.array([4, 3], np.int32), **variants}


@pytest.mark.parametrize("op, build", [("sdpa_varlen", _varlen_inputs), ("sdpa_paged", _paged_inputs)])
def test_packed_and_paged_facts_have_the_variants_too(op, build):
    facts = shape_facts(op, build(window=(2, 0), softcap=5.0, learnable_sink=np.ones(2, np.float32)))
    assert facts["variants"] == ("learnable_sink", "softcap", "window")
    assert facts["variant_values"] == {"learnable_sink": (1.0, 1.0), "softcap": 5.0, "window": (2, 0)}
    assert "query_offset_is_bottom_right" not in facts  # their alignment is SEQUENCE_ALIGNMENT's
    assert shape_facts(op, build())["variants"] == () and shape_facts(op, build())["variant_values"] == {}


def test_a_judge_hands_the_values_of_a_packed_case_to_a_deviation():
    judge = Judge(load_implementation("zoo.correct_varlen_paged_reference"), "float32", "cpu")
    case = Case("sdpa_varlen", _varlen_inputs(window=(1, 0)), ("varlen.definition",), "crafted")
    facts = judge.facts(case, case.rounded("float32"))
    assert facts["variants"] == ("window",) and facts["variant_values"] == {"window": (1, 0)}


def test_sequence_parallel_facts_have_the_values():
    inputs = {"q": np.zeros((1, 2, 4, 3)), "k": np.zeros((1, 1, 4, 3)), "v": np.zeros((1, 1, 4, 3)),
              "window": (2, 0), "world_size": 2, "sequence_layout": "zigzag"}
    facts = region_facts(inputs, "float32", "cpu")
    assert facts["variants"] == ("window",) and facts["variant_values"] == {"window": (2, 0)}


# ------------------------------------------------------------------ real kernels' regions, declared through the values
def _refuse(why) -> None:
    if why:
        raise ValueError(f"called outside the declared region: {why}")


class LeftWindowOnly:
    """FlashAttention's local attention as its callers use it: window_size=(W, 0), a left window only."""

    DTYPES = ("float64",)
    CALLS: list = []

    @staticmethod
    def supports(facts):
        window = facts.get("variant_values", {}).get("window")
        if window is not None and window[1] != 0:
            return f"window {window}: left windows (W, 0) only"
        return None

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, query_offset=0):
        _refuse(window is not None and window[1] != 0 and f"window {window}")
        LeftWindowOnly.CALLS.append(window)
        return chunked.attend(q, k, v, mask, is_causal, scale, window=window, query_offset=query_offset)


class BottomRightOnly:
    """A kernel whose band and window are FlashAttention's, bottom-right: query_offset = Lk - Lq only."""

    DTYPES = ("float64",)
    CALLS: list = []

    @staticmethod
    def supports(facts):
        placed = facts.get("is_causal") or "window" in facts.get("variants", ())
        if placed and facts.get("query_offset_is_bottom_right") is False:
            return "its causal band and window sit bottom-right: query_offset = Lk - Lq only"
        return None

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, query_offset=0):
        placed = is_causal or window is not None
        _refuse(placed and query_offset != k.shape[2] - q.shape[2] and f"query_offset {query_offset}")
        BottomRightOnly.CALLS.append(window if placed else None)
        return chunked.attend(q, k, v, mask, is_causal, scale, window=window, query_offset=query_offset)


@pytest.mark.parametrize("member, tests", [
    ("LeftWindowOnly", (test_variants.test_window, test_variants.test_variants_combined)),
    ("BottomRightOnly", (test_variants.test_query_offset, test_variants.test_window)),
])
def test_a_region_declared_by_values_is_drawn_inside(kept_records, member, tests):
    standin = globals()[member]
    standin.CALLS.clear()
    impl = from_object(standin, member, f"tests.test_variant_facts:{member}")
    verdicts = battery.Verdicts()
    for test in tests:
        battery._run_property(verdicts, impl, test, "float64", 5)
    assert not verdicts.errors, verdicts.errors[:3]
    assert not verdicts.failures, verdicts.failures[:3]  # a call outside would have raised
    assert verdicts.passed == len(tests)  # none skipped: each judged cases inside
    assert any(window is not None for window in standin.CALLS), standin.CALLS


class LeftEdgeOffByOne:
    """A window whose left edge past 4 keys is read one key wider (a defect), declared as a deviation by its value."""

    DTYPES = ("float64",)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None):
        if window is not None and window[0] is not None and window[0] > 4:
            window = (window[0] + 1, window[1])
        return chunked.attend(q, k, v, mask, is_causal, scale, window=window)


def test_a_deviation_reads_the_window_it_covers(kept_records):
    case = Case("sdpa", _sdpa_inputs(lq=9, lk=9, window=(5, 0)), ("sdpa.window",), "crafted")
    with pytest.raises(ConformanceFailure, match=r"sdpa\.window"):
        Judge(from_object(LeftEdgeOffByOne, "off", "tests:off"), "float64", "cpu").check(case)
    declared = types.SimpleNamespace(
        sdpa=LeftEdgeOffByOne.sdpa, DTYPES=("float64",),
        KNOWN_DEVIATIONS=({"clause": ("sdpa.window", "sdpa.definition"), "reason": "left edges past 4 one wider",
                           "when": lambda facts: facts["variant_values"].get("window", (0,))[0] > 4},))
    judge = Judge(from_object(declared, "declared", "tests:declared"), "float64", "cpu")
    with pytest.raises(pytest.xfail.Exception, match="left edges past 4 one wider"):
        judge.check(case)
    narrow = Case("sdpa", _sdpa_inputs(lq=9, lk=9, window=(4, 0)), ("sdpa.window",), "crafted")
    judge.check(narrow)  # inside the edge it computes right, and the deviation does not apply

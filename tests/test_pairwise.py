"""The pairwise covering set (conformance/cases/pairwise.py): every pair of features an implementation runs meets in
a corner, for a region that admits everything and for narrow kernel regions; the rows keep their rules; each corner
builds a case that turns on exactly its features; softmax meets every axis of every rank."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from attention_conformance.conformance.cases import covering, pairwise
from attention_conformance.conformance.cases.drawing import drawing_inside
from attention_conformance.conformance.cases.softmax import softmax_axis_cases, softmax_axis_pairs
from attention_conformance.implementations.region import EVERYTHING, parse_region

pytestmark = pytest.mark.selfcheck

REGIONS = {
    "everything": None,
    "flash-like kernel": {"head_dims": {"min": 16, "max": 256, "multiple": 8}, "masks": ["none"],
                          "variants": ["window", "softcap", "alibi_slopes", "key_lengths"]},
    "causal-free, no GQA": {"causal": False, "gqa": False, "variants": ["window", "attention_chunk", "key_leftpad",
                                                                        "learnable_sink", "sink_token_length"]},
    "lengths a multiple of 64": {"lengths": {"min": 64, "max": 4096, "multiple": 64},
                                 "variants": ["key_lengths", "key_leftpad", "alibi_slopes", "query_offset"]},
}


def region_of(name):
    return EVERYTHING if REGIONS[name] is None else parse_region(REGIONS[name])


@pytest.mark.parametrize("name", sorted(REGIONS))
def test_every_pair_of_features_meets(name):
    region = region_of(name)
    features = pairwise.sdpa_features(region, None)
    rows = pairwise.covering_rows(features)
    missing = pairwise.required_pairs(features) - pairwise.pairs_met(rows)
    assert not missing, sorted(sorted(p) for p in missing)
    for row in rows:
        assert sum(f in pairwise.SDPA_KEYWORDS for f in row) <= pairwise.MAX_KEYWORDS_PER_ROW
        assert sum(f.startswith("mask:") for f in row) <= 1
        assert all(pairwise.BRINGS[f] in row for f in row if f in pairwise.BRINGS)
        assert set(row) <= set(features)


def test_pairs_without_the_causal_flag_meet_in_a_row_without_it():
    rows = pairwise.covering_rows(pairwise.sdpa_features(EVERYTHING, None))
    uncausal = [row for row in rows if pairwise.CAUSAL not in row]
    for a, b in itertools.combinations(pairwise.SDPA_KEYWORDS, 2):
        if pairwise._fits(pairwise._closed({a, b})):
            assert any({a, b} <= row for row in uncausal), (a, b)
    assert any(pairwise.CAUSAL in row and "key_leftpad" in row for row in rows)


def test_the_issue_examples_meet_without_the_causal_band():
    """Left padding with key lengths, ALiBi with left padding, a chunk with left padding: each in a non-causal row."""
    rows = [row for row in pairwise.covering_rows(pairwise.sdpa_features(EVERYTHING, None))
            if pairwise.CAUSAL not in row]
    for pair in ({"key_leftpad", "key_lengths"}, {"alibi_slopes", "key_leftpad"}, {"attention_chunk", "key_leftpad"}):
        assert any(pair <= row for row in rows), pair


def test_a_region_without_a_feature_has_no_pair_of_it():
    region = region_of("flash-like kernel")
    features = pairwise.sdpa_features(region, None)
    assert "key_leftpad" not in features and "mask:bool" not in features
    assert "window" in features and pairwise.CAUSAL in features and "grouped" in features
    assert pairwise.sdpa_features(EVERYTHING, {"q", "k", "v", "window"}) == ["window", "grouped", "past-tile"]


def build(hints):
    draw = covering.DeterministicDraw(hints["index"])
    with covering.building(hints):
        return draw(pairwise.feature_pair_cases(), "case")


@pytest.mark.parametrize("name", sorted(REGIONS))
def test_each_corner_builds_a_case_with_exactly_its_features(name):
    region = region_of(name)
    with drawing_inside(region, {"dtype": "float32", "device": "cpu"}):
        hints = pairwise.pairwise_hints(region, None, small=region is EVERYTHING)
        assert hints
        for corner in hints:
            case = build(corner)
            features = corner["features"]
            inputs = case.inputs
            for keyword in pairwise.SDPA_KEYWORDS:
                assert (keyword in inputs) == (keyword in features), (keyword, sorted(features), case.label)
            assert bool(inputs.get("is_causal", False)) == (pairwise.CAUSAL in features), case.label
            grouped = inputs["q"].shape[1] != inputs["k"].shape[1]
            if "grouped" in features:
                assert grouped, case.label
            mask = inputs.get("mask")
            kinds = [f for f in features if f.startswith("mask:")]
            assert (mask is not None) == bool(kinds), case.label
            if "mask:float" in features:
                assert mask.dtype != np.bool_
            if "past-tile" in features:
                assert max(inputs["q"].shape[2], inputs["k"].shape[2]) > 64, case.label
            assert region.why_outside({"op": "sdpa", **dict(zip(("B", "Hq", "Lq", "Dk"), inputs["q"].shape)),
                                       "Lk": inputs["k"].shape[2], "Dv": inputs["v"].shape[-1]}) is None


def test_corner_values_leave_the_pairs_interaction_visible():
    """Left padding below the key lengths, so both remove keys; a chunk of 2 beside a padding that puts the first
    query inside it."""
    with drawing_inside(EVERYTHING, {"dtype": "float32", "device": "cpu"}):
        for corner in pairwise.pairwise_hints(EVERYTHING, None, small=True):
            inputs = build(corner).inputs
            if "key_leftpad" in inputs and "key_lengths" in inputs:
                assert np.all(inputs["key_leftpad"] >= 1)
                assert np.all(inputs["key_leftpad"] < inputs["key_lengths"])
                assert np.all(inputs["key_lengths"] < inputs["k"].shape[2])
            if "attention_chunk" in inputs and "key_leftpad" in inputs and not inputs.get("query_offset"):
                assert np.any(inputs["key_leftpad"] > 0)


def test_softmax_meets_every_axis_of_every_rank():
    pairs = softmax_axis_pairs()
    assert len(pairs) == 20 and (3, 0) in pairs and (4, -4) in pairs
    for index, (rank, axis) in enumerate(pairs):
        draw = covering.DeterministicDraw(index)
        with covering.building({"index": index, "rank": rank, "axis": axis}):
            case = draw(softmax_axis_cases(), "case")
        x = case.inputs["x"]
        assert x.ndim == rank and case.inputs["axis"] == axis
        assert len(set(x.shape)) == rank  # sizes that differ: a wrong permutation back changes the shape


@pytest.mark.parametrize("op", ["sdpa_varlen", "sdpa_paged", "multi_head_attention", "gradients"])
@pytest.mark.parametrize("name", sorted(REGIONS))
def test_every_pair_meets_for_every_operation(op, name):
    features = pairwise.op_features(op, region_of(name), None)
    rows = pairwise.covering_rows(features)
    assert not pairwise.required_pairs(features) - pairwise.pairs_met(rows)


@pytest.mark.parametrize("op, strategy", [("sdpa_varlen", lambda: pairwise.sequence_pair_cases("sdpa_varlen")),
                                          ("sdpa_paged", lambda: pairwise.sequence_pair_cases("sdpa_paged")),
                                          ("multi_head_attention", pairwise.mha_pair_cases),
                                          ("gradients", pairwise.gradient_pair_cases)])
def test_each_corner_of_every_operation_turns_on_its_keywords(op, strategy):
    with drawing_inside(EVERYTHING, {"dtype": "float32", "device": "cpu"}):
        for corner in pairwise.pairwise_hints(EVERYTHING, None, small=True, op=op):
            draw = covering.DeterministicDraw(corner["index"])
            try:
                with covering.building(corner):
                    case = draw(strategy(), "case")
            except covering.CannotBuild:
                continue  # a gradient corner whose every row lost its keys: drawn again at random
            inputs = case.inputs
            for keyword in pairwise.OP_KEYWORDS[op]:
                name = {"lengths": "key_lengths"}.get(keyword, keyword)
                assert (name in inputs) == (keyword in corner["features"]), (keyword, case.label)
            assert bool(inputs.get("is_causal", False)) == (pairwise.CAUSAL in corner["features"]), case.label


@pytest.mark.usefixtures("kept_records")
@pytest.mark.parametrize("member, pair", [
    ("broken_pair_leftpad_lengths_after_pad", ("sdpa.key-leftpad", "sdpa.varlen")),
    ("broken_pair_alibi_leftpad_query_buffer", ("sdpa.key-leftpad", "sdpa.alibi")),
])
def test_a_fault_of_two_features_is_named_with_both(member, pair):
    """A case drawn for neither (sdpa.feature-pairs) passes without either keyword: both clauses are named."""
    from attention_conformance.conformance.cases.case import Case
    from attention_conformance.conformance.judging.messages import ConformanceFailure
    from attention_conformance.conformance.judging.verdict import Judge
    from attention_conformance.implementations.registry import load_implementation

    rng = np.random.default_rng(4)
    inputs = {"q": rng.standard_normal((2, 2, 3, 4)), "k": rng.standard_normal((2, 1, 7, 4)),
              "v": rng.standard_normal((2, 1, 7, 4)), "key_leftpad": np.array([1, 2], dtype=np.int32)}
    if "lengths" in member:
        inputs["key_lengths"] = np.array([5, 6], dtype=np.int32)
    else:
        inputs["alibi_slopes"] = np.array([0.5, 0.25])
    case = Case("sdpa", inputs, ("sdpa.feature-pairs",), "pair case")
    with pytest.raises(ConformanceFailure) as raised:
        Judge(load_implementation(f"zoo.{member}"), "float32", "cpu").check(case)
    text = " ".join(str(raised.value).split())
    assert raised.value.clause in pair
    assert f"({pair[0]} with {pair[1]})" in text or f"({pair[1]} with {pair[0]})" in text, text

"""The covering set, the budget of examples and the bounded failure of every property (conformance/properties.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from attention_conformance.conformance import test_properties
from attention_conformance.conformance.cases import covering, sequences, variants
from attention_conformance.conformance.cases.drawing import drawing_inside, mask_class
from attention_conformance.conformance.cases.limits import MASK_KINDS
from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.harness import properties
from attention_conformance.conformance.judging import records
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.region import EVERYTHING, parse_region
from attention_conformance.implementations.registry import load_implementation

pytestmark = pytest.mark.selfcheck

PALLAS = parse_region({"head_dims": {"min": 16, "max": 256, "multiple": 16}, "value_head_dim": "same",
                       "lengths": {"multiple": 128, "max": 1024}, "masks": ["none"]})
FLASH = parse_region({"head_dims": {"min": 16, "max": 256, "multiple": 8}, "value_head_dim": "same"})
NO_GQA = parse_region({"gqa": False, "causal": False})
REGIONS = {"everything": EVERYTHING, "pallas": PALLAS, "flash": FLASH, "no-gqa": NO_GQA}


def corner_cases(region, strategy, small=None, with_hints=False):
    """The cases ``strategy`` builds at the corners (those it cannot build left out); ``with_hints``: (hints, case)."""
    small = region.takes_small_shapes() if small is None else small
    built = []
    with drawing_inside(region):
        for hints in covering.covering_hints(region, small):
            with covering.building(hints):
                try:
                    built.append((hints, covering.DeterministicDraw(hints["index"])(strategy)))
                except (pytest.skip.Exception, covering.CannotBuild):
                    continue
    return built if with_hints else [case for _, case in built]


EVERY_MASK_KIND = MASK_KINDS + ("query-padding",)  # and the kind a mask-only corner is about


def facts(case):
    q, k, v = (case.inputs[n] for n in "qkv")
    return {"op": "sdpa", "B": q.shape[0], "Hq": q.shape[1], "Hkv": k.shape[1], "Lq": q.shape[2], "Lk": k.shape[2],
            "Dk": q.shape[3], "Dv": v.shape[3], "is_causal": bool(case.inputs.get("is_causal")),
            "mask_kind": "none" if "mask" not in case.inputs else
            ("bool" if case.inputs["mask"].dtype == np.bool_ else "float"), "scale": case.inputs.get("scale")}


@pytest.mark.parametrize("name", REGIONS)
def test_every_corner_lies_inside_the_region(name):
    region = REGIONS[name]
    cases = corner_cases(region, sdpa_cases(allow_empty_rows=True, mask_kinds=EVERY_MASK_KIND))
    causal_only = sum(corner.get("causal_only", False) for corner in covering.CORNERS)
    # A mask-only corner is not built where the region takes no mask of its kind.
    mask_only = sum(corner.get("mask_only", False) and mask_class(corner["mask_kind"]) not in region.masks
                    for corner in covering.CORNERS)
    assert len(cases) == len(covering.CORNERS) - (0 if region.causal else causal_only) - mask_only
    for case in cases:
        assert region.why_outside(facts(case)) is None, case.label
        f = facts(case)
        assert f["B"] * f["Hq"] * f["Lq"] * f["Lk"] <= covering.COVERING_SCORE_BUDGET


@pytest.mark.parametrize("name", ["everything", "pallas", "flash"])
def test_the_corners_reach_each_structural_corner(name):
    """Causal with Lq <, = and > Lk; one kv head, 1 < Hkv < Hq, Hkv = Hq; both extreme head dims; zero, negative
    and default scales; a length at and one past the region's block."""
    region = REGIONS[name]
    found = [facts(c) for c in corner_cases(region, sdpa_cases(allow_empty_rows=True))]
    causal = {(f["Lq"] > f["Lk"]) - (f["Lq"] < f["Lk"]) for f in found if f["is_causal"]}
    assert causal == {-1, 0, 1}
    assert any(f["Hkv"] == 1 and f["Hq"] > 1 for f in found)
    assert any(1 < f["Hkv"] < f["Hq"] for f in found)
    assert any(f["Hkv"] == f["Hq"] for f in found)
    dims = [f["Dk"] for f in found]
    assert {min(dims), max(dims)} <= set(dims) and min(dims) < max(dims)
    scales = [f["scale"] for f in found]
    assert None in scales and 0.0 in scales and any(s is not None and s < 0 for s in scales)
    block = region.lengths.multiple if region.lengths.multiple > 1 else 64
    lengths = {f["Lq"] for f in found} | {f["Lk"] for f in found}
    assert block in lengths and any(n > block for n in lengths)


def test_a_corner_the_property_holds_fixed_is_not_taken():
    """A property about non-causal, non-grouped cases keeps them so in its corners."""
    cases = corner_cases(EVERYTHING, sdpa_cases(mask_kinds=("none",), causal=st.just(False), gqa=False))
    assert cases and not any(c.inputs.get("is_causal") for c in cases)
    assert all(c.inputs["q"].shape[1] == c.inputs["k"].shape[1] for c in cases)
    assert all("mask" not in c.inputs for c in cases)


def test_each_mask_kind_of_a_property_is_met():
    kinds = ("bool-full", "key-padding", "float")
    cases = corner_cases(EVERYTHING, sdpa_cases(mask_kinds=kinds))
    assert {c.mask_kind for c in cases} == set(kinds)


def test_kernel_corners_cross_a_block_with_the_propertys_own_widths():
    """The tile property's corners (kernel_corners) are kernel-shaped for an implementation that takes the small
    shapes too: a causal Lq = Lk past a block of 64 with a tail of many keys among them (row 64 attends key 64 and
    not 65: an independent kernel whose partial last tile compared tile-local key offsets with the row was exact at
    65), head dims its own."""
    from attention_conformance.conformance.cases.limits import TILE_EDGE_DIMS, TILE_EDGE_LENGTHS

    strategy = sdpa_cases(lengths=TILE_EDGE_LENGTHS, dims=TILE_EDGE_DIMS)
    small = corner_cases(EVERYTHING, strategy)
    assert properties.covering_corners(None, EVERYTHING, "full", kernel_corners=True) == \
        covering.covering_hints(EVERYTHING, small=False)
    cases = corner_cases(EVERYTHING, strategy, small=False)
    shapes = {(c.inputs["q"].shape[2], c.inputs["k"].shape[2], bool(c.inputs.get("is_causal"))) for c in cases}
    assert (127, 127, True) in shapes
    assert not any(c.inputs["q"].shape[2] > 64 and c.inputs["k"].shape[2] > 64 and c.inputs.get("is_causal")
                   for c in small)
    assert max(c.inputs[n].shape[3] for c in cases for n in "qv") <= 33  # TILE_EDGE_DIMS, not the kernel dims (256)


@pytest.mark.parametrize("region", [EVERYTHING, FLASH], ids=["everything", "flash"])
def test_the_decode_propertys_corners_reach_past_4096_keys(region):
    """A split-KV decode kernel that caps its splits (keys past 4096 dropped) passed caches of at most 2049 keys."""
    strategy = sdpa_cases(mask_kinds=("none", "key-padding", "float"), causal=st.just(False), query_mode="decode")
    cases = corner_cases(region, strategy)
    decode = [c for c in cases if c.inputs["q"].shape[2] <= 4]
    assert 4097 in {c.inputs["k"].shape[2] for c in decode}
    assert all(np.prod(c.inputs["q"].shape[:3]) * c.inputs["k"].shape[2] <= covering.COVERING_SCORE_BUDGET
               for c in decode)


def test_the_softmax_properties_first_corners_are_rows_past_1024():
    """A softmax whose rows past 1024 take a chunked path (its running sum not rescaled) passed rows of at most 300."""
    from attention_conformance.conformance.cases.softmax import SOFTMAX_CORNER_ROWS, softmax_cases

    cases = corner_cases(EVERYTHING, softmax_cases())
    axes = [(c.inputs["x"].shape[c.inputs.get("axis", -1)], c.inputs["x"].size) for c in cases[:2]]
    assert [n for n, _ in axes] == [2049, 1025]
    assert all(size >= SOFTMAX_CORNER_ROWS * n for n, size in axes)


def test_random_draws_see_no_hints():
    """Outside a corner the strategies draw as they always have: the hints are only read while building."""
    assert covering.hint("lengths") is None and not covering.hinted("scale")
    with covering.building({"lengths": (3, 5)}):
        assert covering.hint("lengths") == (3, 5)
    assert covering.hint("lengths") is None


@pytest.mark.parametrize("strategy, values", [
    (st.booleans(), [False, True]), (st.just(3), [3]), (st.none(), [None]), (st.integers(1, 4), [1, 2, 3, 4]),
    (st.sampled_from([2, 1]) | st.integers(1, 3), [2, 1, 3]), (st.integers(1, 9).filter(lambda n: n % 3 == 0), [3, 6, 9]),
    (st.floats(0, 1), None), (st.integers(0, 2**32), None),
])
def test_strategy_values_lists_what_a_strategy_can_draw(strategy, values):
    assert covering.strategy_values(strategy) == values


def test_budget_floor_for_narrow_or_compiling_implementations_only():
    broad = load_implementation("zoo.correct_reference")
    narrow = load_implementation("zoo.kernel_correct_pallas_region")
    # A broad, cheap implementation: the profile's examples, corners first, at least MIN_RANDOM_EXAMPLES random.
    assert properties.random_examples(broad, broad.region, 10, 8, 1) == 2
    assert properties.random_examples(broad, broad.region, 25, 8, 1) == 17
    # A narrow one reaches FLOOR_PER_PROPERTY judged examples per property.
    assert properties.random_examples(narrow, narrow.region, 10, 5, 1) == properties.FLOOR_PER_PROPERTY - 5
    assert properties.random_examples(narrow, narrow.region, 10, 5, 1, floor=properties.NARROW_FLOOR_PER_PROPERTY) == 20
    assert properties.random_examples(narrow, narrow.region, 10, 5, 1, floor=0) == 5


def test_a_failing_corner_fails_the_property_at_once(kept_records):
    """The Pallas-shaped kernel whose causal key loop runs past the last key block fails on its first corner
    (causal, Lq 256 > Lk 128), before any random draw."""
    impl = load_implementation("zoo.kernel_broken_causal_past_last_key_block")
    fn = test_properties.test_causal_top_left
    calls = []
    inner = fn.__wrapped__.hypothesis.inner_test

    def counted(*args, **kwargs):
        calls.append(kwargs["case"].label)
        return inner(*args, **kwargs)

    fn.__wrapped__.hypothesis.inner_test = counted
    try:
        with pytest.raises(ConformanceFailure) as failed:
            fn(impl=impl, device="cpu", dtype="float32")
    finally:
        fn.__wrapped__.hypothesis.inner_test = inner
    assert failed.value.clause == "sdpa.finite"
    assert len(calls) == 1 and "Lq256 Lk128" in calls[0] and "causal" in calls[0]


def test_shrinking_stops_at_its_time_limit_and_keeps_one_failed_record(monkeypatch, kept_records):
    """Past SHRINK_BUDGET_S after the first failure the smallest failure so far is the verdict, and the session
    keeps one failed record for it (not one per shrink attempt)."""
    monkeypatch.setattr(properties, "SHRINK_BUDGET_S", 0.0)
    monkeypatch.setattr(covering, "CORNERS", ())  # no corners: the failure is met by a random draw, then shrunk
    impl = load_implementation("zoo.broken_sdpa_no_scale")
    start = len(records.RECORDS)
    with pytest.raises(properties.ShrinkingStopped) as stopped:
        test_properties.test_default_scale(impl=impl, device="cpu", dtype="float64")
    assert "[sdpa.scale-default]" in str(stopped.value) and "SHRINK_BUDGET_S" in str(stopped.value)
    failed = [r for r in records.RECORDS[start:] if r.status == "failed"]
    assert len(failed) == 1


class _Cheap:
    compiled = False


class _Compiling:
    compiled = True


@pytest.mark.parametrize("region", [EVERYTHING, FLASH], ids=["everything", "flash"])
def test_a_compiling_implementations_brief_corners_reach_groups_batches_scales_and_float_masks(region):
    """A compiling implementation's random example of a brief property (gradients, variants, MHA, dropout) is
    Hypothesis's simplest (batch 1, one key), so its corners carry the property: grouped kv heads (a JAX custom_vjp
    folding dK, dV in tile order, zoo broken_backward_gqa_tile_order_jax, passed with Hkv 1), batch 2 (dsink averaged
    and dmask summed over the batch passed), a non-causal one at the default scale with a float mask (a backward
    dropping the window's right edge, an MHA float mask added before the scale passed), scale 0 (a backward taking
    `scale or 1/sqrt(Dk)` passed) and an explicit scale that is no +-1/sqrt(Dk) (softcap's derivative at the default
    scale passed)."""
    corners = properties.covering_corners(_Compiling(), region, "brief")
    assert any(hints["Hkv"] > 1 and hints["group"] > 1 and hints["B"] > 1 for hints in corners)
    assert any(not hints["is_causal"] and hints["scale"] is None and hints["mask_kind"] == "float" and hints["B"] > 1
               for hints in corners)
    assert any(hints["scale"] == 0.0 for hints in corners)
    assert any(hints["scale"] not in (None, 0.0) and abs(hints["scale"]) != hints["Dk"] ** -0.5 for hints in corners)
    # ... and sdpa_cases' own scales take every corner's (a scale it cannot draw is silently drawn instead)
    for hints, case in corner_cases(region, sdpa_cases(), with_hints=True):
        assert case.inputs.get("scale") == hints["scale"], (case.label, hints["scale"])


def test_multi_head_attention_corners_take_the_corners_batch_lengths_and_mask():
    """mha_cases ignored the corners: every MHA corner was Hypothesis's simplest case (batch 1, one query, one key, no
    mask), and an MHA float mask added before the scale passed every run of a compiling implementation."""
    from attention_conformance.conformance.cases.mha import mha_cases

    built = corner_cases(EVERYTHING, mha_cases(), with_hints=True)
    cases = [case for _, case in built]
    last = next(case for hints, case in built if hints["index"] == covering.COMPILED_BRIEF_CORNER)
    assert last.inputs["query"].shape[0] == 2 and last.inputs["key"].shape[1] > 1
    assert last.inputs["mask"].dtype != np.bool_
    assert len({(c.inputs["query"].shape[:2], c.inputs["key"].shape[1]) for c in cases}) > 3


def test_the_decode_propertys_large_score_corner_has_a_long_cache():
    """A split-KV combine that weights its splits by exp(lse) without the largest subtracted overflows only when
    a split's log-sum-exp passes about 88.7 (float32): large scores and more keys than a split (zoo
    broken_decode_combine_no_max, 1 of 3 seeds before)."""
    strategy = sdpa_cases(mask_kinds=("none", "key-padding", "float"), causal=st.just(False), query_mode="decode")
    large = [c for c in corner_cases(EVERYTHING, strategy) if "scores~large" in c.label]
    assert large and max(c.inputs["k"].shape[2] for c in large) > 4096


def test_the_variant_properties_take_kernel_corners_unless_the_implementation_compiles():
    """test_window, test_softcap, test_alibi, the query-offset tests, test_varlen and test_learnable_sink
    (kernel_corners=UNLESS_COMPILED): kernel-shaped corners, past a key block of 64, for an implementation that takes
    the small shapes and calls cheaply (independent tiled kernels that skipped the softcap on whole key blocks, added
    the sink once per block, or cut a window's last key block passed with small corners); for a compiling
    implementation the first two past a query block (an independent Pallas kernel whose causal key-block bound
    floored query_offset to its block of 16 passed every run on small corners; the second: test below), the third
    small, each kernel-shaped corner in place of a small one: no further compile."""
    from attention_conformance.conformance import test_variants

    kernel = properties.covering_corners(_Cheap(), EVERYTHING, "brief", properties.UNLESS_COMPILED)
    compiled = properties.covering_corners(_Compiling(), EVERYTHING, "brief", properties.UNLESS_COMPILED)
    assert kernel and all(hints["kernel"] and max(hints["lengths"]) > 64 for hints in kernel)
    assert compiled[0]["kernel"] and min(compiled[0]["lengths"]) > covering.QUERY_BLOCK_ROWS
    assert compiled[1] == covering.compiled_window_hints(EVERYTHING) and min(compiled[1]["lengths"]) > 128
    assert len(compiled) == 3 and not compiled[2]["kernel"]
    assert properties.covering_corners(_Cheap(), EVERYTHING, "brief") == [
        h for i, h in enumerate(covering.covering_hints(EVERYTHING, small=True)) if i in properties.BRIEF_CORNERS]
    assert all(getattr(test_variants, name).kernel_corners == properties.UNLESS_COMPILED
               for name in ("test_window", "test_softcap", "test_alibi", "test_varlen", "test_learnable_sink",
                            "test_query_offset", "test_query_offset_is_a_shifted_causal_mask"))


def test_a_compiling_implementations_window_corner_has_a_right_edge_across_key_blocks():
    """An independently written compiled JAX kernel (query blocks of 64, key blocks of 128) that ended each query
    block's key loop at its first row's right window edge passed every run while its non-causal brief corner was small
    with right edge 0: that corner is now past a query block, Lq < Lk, right edge 33, so the rows of one query block
    reach a key block their first row does not; zoo/broken_tiled_window_right_block_from_first_row fails it (and
    nothing else of its run)."""
    from attention_conformance.conformance.judging.verdict import Judge

    strategy = variants.variant_cases(variants=("window",), clauses=("sdpa.window",))
    with drawing_inside(EVERYTHING), covering.building(covering.compiled_window_hints(EVERYTHING)):
        case = covering.DeterministicDraw(2)(strategy)
    q, k = case.inputs["q"], case.inputs["k"]
    lq, lk = q.shape[2], k.shape[2]
    left, right = case.inputs["window"]
    assert not case.inputs.get("is_causal") and right == covering.WINDOW_RIGHT_ACROSS_BLOCKS and left >= lq + lk
    assert lq > covering.QUERY_BLOCK_ROWS and lk > lq
    for query_block, key_block in ((64, 128), (128, 128), (128, 64)):
        first_rows = np.arange(lq) // query_block * query_block
        assert np.any((first_rows + right) // key_block < np.minimum(np.arange(lq) + right, lk - 1) // key_block)
    judge = Judge(load_implementation("zoo.broken_tiled_window_right_block_from_first_row"), "float32", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    assert raised.value.clause == "sdpa.window"
    Judge(load_implementation("zoo.correct_variants_reference"), "float32", "cpu").check(case)


@pytest.mark.parametrize("implementation, region", [(_Cheap(), EVERYTHING), (_Compiling(), FLASH)],
                         ids=["cheap", "compiling-kernel-region"])
def test_the_variant_kernel_corners_reach_a_second_query_block_and_split_kv_decode(implementation, region):
    """Independent tiled kernels (query blocks of 128 rows) that measured ALiBi from the row inside its block, masked
    key lengths in the last key block only, or forgot the sink in split-KV decode passed corners of at most 65 rows
    and a brief set without decode: the variant properties' kernel corners have a query past row 128 (Lq > Lk and
    Lq = Lk) and, for an implementation that does not compile, Lq 1 against more than 128 keys. A compiling
    implementation whose region holds only kernel shapes gets the longer lengths at no further compile."""
    corners = properties.covering_corners(implementation, region, "brief", properties.UNLESS_COMPILED)
    assert any(hints["lengths"][0] > 128 for hints in corners)
    assert all(hints["Dk"] <= covering.PAST_QUERY_BLOCK_MAX_DK for hints in corners)
    if not implementation.compiled:
        pairs = {hints["lengths"] for hints in corners}
        assert any(lq > 128 and lq > lk for lq, lk in pairs) and any(lq > 128 and lq == lk for lq, lk in pairs)
        assert any(lq == 1 and lk > 128 for lq, lk in pairs)
    # The other properties keep their queries within one query block (but the long-query corner).
    assert all(h["lengths"][0] < covering.QUERY_BLOCK_ROWS
               for h in properties.covering_corners(implementation, region, "full")
               if covering.CORNERS[h["index"]]["lengths"] != "long-q")


def test_a_property_that_holds_is_causal_off_skips_the_long_query_corner():
    cases = corner_cases(EVERYTHING, sdpa_cases(causal=st.just(False)))
    assert cases and not any(c.inputs["q"].shape[2] > 129 for c in cases)


@pytest.mark.parametrize("name", list(REGIONS))
def test_a_corner_runs_a_long_query_against_few_keys(name):
    """A kernel that ran queries in chunks of 256 rows and built each chunk's causal band from chunk-local rows passed
    two default runs: the last corner is causal, Lq past 1024 (or the region's longest) against a few keys."""
    region = REGIONS[name]
    hints = [h for h in covering.covering_hints(region, region.takes_small_shapes())
             if covering.CORNERS[h["index"]]["lengths"] == "long-q"]
    assert len(hints) == 1 and hints[0]["is_causal"]
    lq, lk = hints[0]["lengths"]
    assert lq >= min(covering.LONG_QUERY_ROWS - 1, region.lengths.max or lq) and 2 <= lk < lq
    assert hints[0]["Hkv"] * hints[0]["group"] * lq * lk <= covering.COVERING_SCORE_BUDGET


def test_a_covering_corners_learnable_sink_changes_its_rows():
    """The "below" sink form leaves every row as it is; a covering corner that drew it tested nothing of the sink
    (a split-KV decode path that forgot the sink passed a run whose decode corner had drawn it)."""

    strategy = variants.sink_chunk_leftpad_cases(features=("learnable_sink",), mask_kinds=("none",))
    cases = corner_cases(EVERYTHING, strategy, small=False)
    assert len(cases) >= 4
    assert all("sink=below" not in case.label for case in cases)
    assert "below" in variants.SINK_FORMS  # random draws still take it


def test_the_non_causal_corners_window_has_a_left_side_past_every_key_and_a_right_edge_that_removes_keys():
    """A kernel that ran full attention where a window's left side passed every query position without is_causal
    (libflash_attn PR 11) was caught by one random decode case per run: the non-causal corner every brief set holds
    now takes (past, 0), where only the right edge removes keys."""
    from attention_conformance.conformance.cases.variants import variant_cases

    strategy = variant_cases(variants=("window", "query_offset"), clauses=("sdpa.window",))
    case = corner_cases(EVERYTHING, strategy)[2]
    q, k = case.inputs["q"], case.inputs["k"]
    left, right = case.inputs["window"]
    offset = case.inputs.get("query_offset", 0)
    assert not case.inputs.get("is_causal") and right == 0 and left >= offset + q.shape[2]  # past every distance
    assert 2 in properties.BRIEF_CORNERS and 2 in properties.BRIEF_CORNERS_COMPILED
    assert not oracle.positions_allowed(q.shape[2], k.shape[2], False, (left, 0), offset).all()  # the right edge


@pytest.mark.parametrize("op", ["sdpa_varlen", "sdpa_paged"])
def test_the_non_causal_sequence_corner_has_queries_past_every_key_and_a_left_only_window(op):
    """FlashAttention gives a bounded left side with an unbounded right the right edge seqlen_k (the batch's longest
    sequence of keys; the block table's pages times their size, paged): wrong for a sequence with two more queries
    than that, whose first rows sit before its keys (flash-attention issue #895). Random windows met it in some runs
    (an independent kernel doing so passed 4 of 9): the non-causal brief corner of sdpa_varlen and sdpa_paged has such a
    sequence and the window (1, None), and that edge removes keys there."""

    strategy = (sequences.varlen_cases if op == "sdpa_varlen" else sequences.paged_cases)(
        variants=("window",), clauses=("varlen.variants",))
    case = corner_cases(EVERYTHING, strategy)[2]
    assert not case.inputs.get("is_causal") and case.inputs["window"] == sequences.SEQUENCE_CORNER_WINDOW
    per_sequence = oracle.sequence_cases(op, case.inputs)
    if op == "sdpa_varlen":
        reach = max(one["k"].shape[2] for one in per_sequence)
    else:
        table = case.inputs["block_table"]
        reach = table.shape[1] * case.inputs["k_cache"].shape[1]
    lq, lk = max((one["q"].shape[2], one["k"].shape[2]) for one in per_sequence)
    assert lq >= reach + 2
    kept = oracle.positions_allowed(lq, lk, False, (1, None), lk - lq)[0, 0]
    clamped = oracle.positions_allowed(lq, lk, False, (1, reach), lk - lq)[0, 0]
    assert (kept != clamped).any()


@pytest.mark.parametrize("name", ["everything", "pallas", "flash"])
def test_every_kernel_corner_past_a_query_block_is_built_with_its_lengths_and_batch(name):
    """The batch-2 corners past a query block (4 heads, 129 x 192) passed the score budget that sdpa_cases counts
    with the batch, so they drew their lengths instead: Hypothesis's simplest, Lq 1 and Lk 1, for every variant
    property of a non-compiling implementation. A corner fits the budget with its batch, and is built as hinted."""
    from attention_conformance.conformance.cases.variants import variant_cases

    region = REGIONS[name]
    strategy = variant_cases(variants=("window",), clauses=("sdpa.window",), mask_kinds=("none", "key-padding",
                                                                                        "bool-full"))
    hints = covering.covering_hints(region, small=False, past_query_block=True)
    built = []
    with drawing_inside(region):
        for corner in hints:
            with covering.building(corner):
                try:
                    built.append((corner, covering.DeterministicDraw(corner["index"])(strategy)))
                except (pytest.skip.Exception, covering.CannotBuild):
                    continue
    assert len(built) >= 10
    for corner, case in built:
        q, k = case.inputs["q"], case.inputs["k"]
        assert q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] <= covering.COVERING_SCORE_BUDGET
        assert sorted((q.shape[2], k.shape[2])) == sorted(corner["lengths"]) or corner.get("long_cache"), case.label
        assert q.shape[0] == corner["B"], case.label
    assert any(corner["B"] == 2 and max(corner["lengths"]) > 128 for corner, _ in built)


def test_a_kernel_regions_q_lt_k_corner_has_queries_a_whole_block_and_keys_one_past_two():
    """A Triton kernel that took EVEN_N (keys whole blocks) from Lq skipped the key mask where Lq is a multiple of
    its block and Lk is not: every kernel corner had Lq off the block or Lk on it ((64, 128) among them). A region of
    kernel shapes (head dims from 16, as Triton's tl.dot needs) now meets (64, 129) at its q<k corners, one of them
    non-causal with unit scores (rows that reach the padding past the last key)."""
    pairs = {(hints["lengths"], hints["is_causal"]) for hints in covering.covering_hints(FLASH, small=False)}
    assert ((64, 129), False) in pairs, sorted(pairs)


def test_an_outlier_channel_case_passes_float16s_range_unscaled_and_not_scaled():
    """sdpa.score-range: in float16 the unscaled q.k of an outlier channel passes 65504 and the scaled score does
    not; an implementation that rounds q @ k^T before its scale (zoo broken_scores_unscaled_in_float16) overflows."""
    from attention_conformance.conformance.cases.sdpa import outlier_channel_cases

    for index in range(4):
        with drawing_inside(EVERYTHING):
            case = covering.DeterministicDraw(index)(outlier_channel_cases())
        q, k = (case.inputs[n].astype(np.float16).astype(np.float64) for n in "qk")
        raw = np.abs(q @ np.swapaxes(oracle.repeat_kv_heads(k, q.shape[1]), -1, -2))
        assert raw.max() > 65504 and raw.max() * q.shape[-1] ** -0.5 < 65504 / 2, case.label


@pytest.mark.parametrize("head_dims, scaled_past", [([8], 65504 / 2), ([2], 0.0)], ids=["Dk8", "Dk2"])
def test_an_outlier_channel_case_of_a_kernel_region_stays_inside_float16(head_dims, scaled_past):
    """A kernel-shaped case takes its region's head dims, not the property's (the GPU run's cuDNN case had Dk 8:
    scaled scores up to 3.5e4, a row spanning 6.9e4). Below Dk 4 the product shrinks: at Dk 2 the full one would put
    the scaled score at 6.9e4, past float16's range, a case no float16 implementation could pass."""
    from attention_conformance.conformance.cases.sdpa import OUTLIER_SCALED_SCORE, outlier_channel_cases

    region = parse_region({"head_dims": head_dims, "value_head_dim": "same"})
    for index in range(3):
        with drawing_inside(region):
            case = covering.DeterministicDraw(index)(outlier_channel_cases())
        q, k = (case.inputs[n].astype(np.float16).astype(np.float64) for n in "qk")
        assert q.shape[-1] == head_dims[0], case.label
        scaled = np.abs(q @ np.swapaxes(oracle.repeat_kv_heads(k, q.shape[1]), -1, -2)) * q.shape[-1] ** -0.5
        assert scaled_past < scaled.max() <= OUTLIER_SCALED_SCORE * 1.01, case.label


@pytest.mark.parametrize("op", ["sdpa_varlen", "sdpa_paged"])
def test_every_brief_set_holds_a_sequence_past_two_key_blocks(op):
    """A varlen kernel that dropped the last Lk % 64 keys of a sequence past 64, and a paged one that read its block
    table modulo 16 entries, passed default runs whose sequences stayed within 17 keys and 10 pages: the first corner
    of every brief set (compiling or not) packs a sequence of more than 128 queries and keys, Lk not a multiple of 64,
    and the paged one spreads its cache over more than 32 pages."""
    assert properties.BRIEF_CORNERS[0] == properties.BRIEF_CORNERS_COMPILED[0]
    strategy = (sequences.varlen_cases if op == "sdpa_varlen" else sequences.paged_cases)(clauses=("varlen.definition",))
    [case] = [case for hints, case in corner_cases(EVERYTHING, strategy, with_hints=True)
              if hints["index"] == properties.BRIEF_CORNERS[0]]
    per_sequence = oracle.sequence_cases(op, case.inputs)
    lk = max(one["k"].shape[2] for one in per_sequence)
    assert lk > 128 and lk % 64
    if op == "sdpa_varlen":
        assert max(one["q"].shape[2] for one in per_sequence) > 128
    else:
        pages = -(-np.asarray(case.inputs["seqused_k"]) // case.inputs["k_cache"].shape[1])
        assert pages.max() > 32


def test_the_sink_token_corners_leave_the_first_key_block_behind_every_rows_window():
    """A tiled kernel that skipped the key blocks left of a window, the sink tokens' block with them, passed 11 of 12
    default runs: at each kernel-shaped corner of test_sink_tokens the window's left edge and the offset leave the
    whole first key block of 64 left of every row's window, with a sink token in it."""
    from attention_conformance.conformance.test_variants import test_sink_tokens

    assert test_sink_tokens.kernel_corners == properties.UNLESS_COMPILED
    strategy = variants.sink_chunk_leftpad_cases(features=("sink_token_length",), variants=("window",),
                                                 optional=("query_offset",), clauses=("sdpa.sink-tokens",),
                                                 mask_kinds=("none", "key-padding"))
    kernel_shaped = 0
    with drawing_inside(EVERYTHING):
        for hints in properties.covering_corners(None, EVERYTHING, "brief", properties.UNLESS_COMPILED):
            with covering.building(hints):
                case = covering.DeterministicDraw(hints["index"])(strategy)
            if case.inputs["k"].shape[2] <= variants.SINK_TOKENS_BLOCK:
                continue
            kernel_shaped += 1
            left = case.inputs["window"][0]
            assert case.inputs["sink_token_length"] >= 1 and left == variants.SINK_TOKENS_WINDOW_LEFT
            assert case.inputs["query_offset"] - left >= variants.SINK_TOKENS_BLOCK  # row 0's window starts past it
            assert f"window={case.inputs['window']}" in case.label and f"offset={case.inputs['query_offset']} " in \
                case.label
    assert kernel_shaped >= 3

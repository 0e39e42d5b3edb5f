"""The blocked oracle (conformance/oracle_blocked.py) gives what the full oracle and tolerance model give.

Blocks smaller than Lq make every case cross block boundaries, so a causal band
built from block-local row numbers, or a mask sliced wrongly, shows up here.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import blocked as oracle_blocked
from attention_conformance.conformance.reference import oracle, tolerances
from attention_conformance.conformance.test_large_shapes import LargeShapeJudge
from attention_conformance.implementations.registry import load_implementation

pytestmark = pytest.mark.selfcheck

# The blocked matrix products may sum in another order than the full ones: a few ulps per element.
RTOL = 1e-12
POLICIES = ("zeros", "nan", "uniform")


# The 16-bit allowance (spec/tolerances.yaml, sixteen_bit) sums its random walks as sum w^2 v^2 - 2 o sum w^2 v
# + o^2 sum w^2, which cancels: another summation order moves it by up to ~1e-9 of itself. An allowance
# is a bound, not a result: agreement to 1e-6 is exact for every verdict that matters.
RTOL_SIXTEEN_BIT = 1e-6


def assert_close(got, want, rtol=RTOL):
    """Equal to rtol relative to the array's scale; NaN exactly where the other has NaN."""
    got, want = np.broadcast_arrays(got, want)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    scale = max(1.0, float(np.nanmax(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=rtol, atol=rtol * scale)


def check_against_full(inputs: dict, block: int, dtype: str = "float32", policy: str = "zeros") -> None:
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    mask, is_causal, scale = inputs.get("mask"), inputs.get("is_causal", False), inputs.get("scale")
    expected, allowed = oracle_blocked.sdpa_with_allowed(
        q, k, v, mask, is_causal, scale, dtype=dtype, policy=policy, block=block
    )
    assert expected.shape == q.shape[:-1] + v.shape[-1:]
    assert_close(expected, oracle.sdpa(q, k, v, mask, is_causal, scale, fully_masked_rows_policy=policy))
    rtol = RTOL_SIXTEEN_BIT if tolerances.is_sixteen_bit(dtype) else RTOL
    assert_close(allowed, tolerances.sdpa_allowed(q, k, v, mask, is_causal, scale, dtype, policy), rtol)
    assert_close(
        oracle_blocked.sdpa(q, k, v, mask, is_causal, scale, fully_masked_rows_policy=policy, block=block),
        expected,
    )
    assert np.array_equal(
        oracle_blocked.fully_masked_rows(q, k, mask, is_causal, block=block),
        oracle.fully_masked_rows(q, k, mask, is_causal),
    )


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(case=sdpa_cases(allow_empty_rows=True), block=st.integers(1, 4))
def test_blocked_tf32_allowance_matches_the_full_one(case, block):
    """A TF32-declared float32 implementation (FLOAT32_MATMUL) gets the same allowance blocked as whole: the 16-bit
    model's (spec/tolerances.yaml, tf32), so to the 16-bit model's agreement."""
    a = case.inputs
    args = (a["q"], a["k"], a["v"], a.get("mask"), a.get("is_causal", False), a.get("scale"))
    _, allowed = oracle_blocked.sdpa_with_allowed(*args, dtype="float32", block=block, tf32=True)
    assert_close(allowed, tolerances.sdpa_allowed(*args, "float32", tf32=True), RTOL_SIXTEEN_BIT)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    case=sdpa_cases(allow_empty_rows=True),
    block=st.integers(1, 4),
    dtype=st.sampled_from(["float32", "float16", "bfloat16", "float64"]),
    policy=st.sampled_from(POLICIES),
)
def test_blocked_matches_the_full_oracle_on_generated_cases(case, block, dtype, policy):
    check_against_full(case.inputs, block, dtype, policy)


def make_inputs(b=2, hq=4, hkv=2, lq=7, lk=5, dk=3, dv=4, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "q": rng.standard_normal((b, hq, lq, dk)) * 2,
        "k": rng.standard_normal((b, hkv, lk, dk)) * 2,
        "v": rng.standard_normal((b, hkv, lk, dv)),
    }


def masks(b, hq, lq, lk, rng):
    """Masks of every broadcast shape, bool and float, some with fully masked rows."""
    shapes = [(b, hq, lq, lk), (b, 1, lq, lk), (1, hq, lq, lk), (lq, lk), (b, 1, 1, lk), (1, lk), (lk,)]
    out = {}
    for shape in shapes:
        keep = rng.random(shape) < 0.6
        out[f"bool{shape}"] = keep
        out[f"float{shape}"] = np.where(keep, rng.standard_normal(shape), -np.inf)
        out[f"float-fill{shape}"] = np.where(keep, rng.standard_normal(shape), -1e9)
    return out


LENGTHS = [(7, 5), (5, 7), (6, 6), (1, 9), (9, 1)]


@pytest.mark.parametrize("lq,lk", LENGTHS)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_every_mask_shape_with_and_without_causal(lq, lk, is_causal, policy):
    inputs = make_inputs(lq=lq, lk=lk)
    for name, mask in masks(2, 4, lq, lk, np.random.default_rng(lq * 10 + lk)).items():
        for block in (2, 3):
            check_against_full({**inputs, "mask": mask, "is_causal": is_causal}, block, policy=policy)


@pytest.mark.parametrize("scale", [None, 0.0, -0.7, 3.0])
@pytest.mark.parametrize("hq,hkv", [(1, 1), (4, 4), (6, 2), (3, 1)])
def test_scales_and_grouped_query_heads(scale, hq, hkv):
    inputs = make_inputs(hq=hq, hkv=hkv, lq=8, lk=6, seed=hq * 7 + hkv)
    check_against_full({**inputs, "scale": scale, "is_causal": True}, block=3)
    check_against_full({**inputs, "scale": scale}, block=2)


@pytest.mark.parametrize("block", [1, 2, 5, 7, 8, 100])
def test_any_block_size_including_larger_than_lq(block):
    check_against_full({**make_inputs(lq=7, lk=9), "is_causal": True}, block=block)


def test_causal_band_uses_the_global_query_index():
    """Row i of block b attends keys 0..i, i counted from the first query, not from the block's start."""
    inputs = make_inputs(b=1, hq=1, hkv=1, lq=6, lk=6)
    for rows in oracle_blocked.row_blocks(6, 4):
        bias = oracle_blocked.block_bias(None, True, rows, slice(0, 6))
        np.testing.assert_array_equal(np.isfinite(bias), oracle.causal_allowed(6, 6)[rows])
    check_against_full({**inputs, "is_causal": True}, block=4)


def test_a_bad_block_size_is_refused():
    with pytest.raises(ValueError, match="block"):
        oracle_blocked.sdpa(**make_inputs(), block=0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_memory_stays_linear_in_length(dtype):
    """Lq = Lk = 4096: the full oracle needs Lq*Lk*8 B = 128 MiB per (Lq, Lk) array; the blocked one a few MiB,
    also for the 16-bit allowance (a few (block, Lk) arrays per step).

    NumPy reports its allocations to tracemalloc, so the peak covers every array.
    """
    lq = lk = 4096
    dim = 16
    inputs = make_inputs(b=1, hq=1, hkv=1, lq=lq, lk=lk, dk=dim, dv=dim)
    inputs["mask"] = np.random.default_rng(1).random((1, 1, 1, lk)) < 0.9
    full_matrix = lq * lk * 8
    tracemalloc.start()
    try:
        expected, allowed = oracle_blocked.sdpa_with_allowed(**inputs, is_causal=True, block=dim, dtype=dtype)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.isfinite(expected).all() and (allowed > 0).all()
    assert peak < full_matrix / 8, (
        f"peak {peak / 2**20:.1f} MiB; one (Lq, Lk) float64 array is {full_matrix / 2**20:.0f} MiB"
    )


# ------------------------------------------ the large-shape judge, on small cases
# One implementation per fully-masked-row policy, and one that fails.
JUDGED = ["builtin:numpy_native", "zoo.correct_nan_fully_masked", "zoo.correct_uniform_fully_masked",
          "zoo.broken_causal_plus_one"]


def verdict(judge, case, judge_case):
    """(clause or 'passed', the record's status and figures)."""
    try:
        got, inputs = judge.run(case)
        record = judge_case(judge)(case, got, inputs)
        outcome = "passed"
    except ConformanceFailure as failure:
        outcome, record = failure.clause, failure.record
    return outcome, record.status, [record.max_abs_error, record.allowed, record.ratio]


@pytest.mark.parametrize("spec", JUDGED)
def test_the_large_shape_judge_agrees_with_judge(spec, kept_records):
    """Same verdict, clause, status and figures as Judge.judge, and the same deviation facts."""
    impl = load_implementation(spec)

    @settings(max_examples=25, deadline=None, derandomize=True, database=None)
    @given(case=sdpa_cases(allow_empty_rows=True))
    def agree(case):
        full, blocked = Judge(impl, "float32", "cpu"), LargeShapeJudge(impl, "float32", "cpu")
        want = verdict(full, case, lambda j: j.judge)
        got = verdict(blocked, case, lambda j: j.judge)
        assert got[:2] == want[:2]
        np.testing.assert_allclose(np.array(got[2], dtype=float), np.array(want[2], dtype=float), rtol=1e-9)
        inputs = case.rounded("float32")
        assert blocked.facts(case, inputs) == full.facts(case, inputs)

    agree()


# ------------------------------------------- variants, packed and paged batches
VARIANT_CASES = {
    "window-causal": dict(is_causal=True, window=(3, 1)),
    "softcap-alibi": dict(softcap=5.0, alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625])),
    "offset-window": dict(is_causal=True, query_offset=-3, window=(2, 0)),
    "lengths": dict(key_lengths=np.array([11, 4]), query_lengths=np.array([9, 5])),
    "sinks": dict(learnable_sink=np.array([0.5, -1.0, 3.0, 0.0]), sink_token_length=2, window=(2, 0)),
    "chunk-leftpad": dict(is_causal=True, attention_chunk=4, key_leftpad=np.array([0, 3])),
    "bool-mask-window": dict(mask="bool", window=(4, 4)),
    "float-mask-alibi": dict(mask="float", alibi_slopes=np.array([[0.5, 0.1, 0.2, 0.3], [0.0, 1.0, 0.4, 0.6]])),
}


def variant_case(name: str) -> dict:
    """q (2, 4, 9, 8) against k, v (2, 2, 11, *): GQA, Lq < Lk, rows emptied by the bool mask and the band."""
    rng = np.random.default_rng(sorted(VARIANT_CASES).index(name))
    case = {"q": rng.standard_normal((2, 4, 9, 8)) * 2, "k": rng.standard_normal((2, 2, 11, 8)),
            "v": rng.standard_normal((2, 2, 11, 5)), "is_causal": False, "scale": None, **VARIANT_CASES[name]}
    if case.get("mask") == "bool":
        case["mask"] = rng.random((2, 1, 9, 11)) < 0.6
        case["mask"][0, 0, 2] = False  # a row without keys
    elif case.get("mask") == "float":
        case["mask"] = np.where(rng.random((9, 11)) < 0.2, -np.inf, rng.standard_normal((9, 11)))
    return case


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("block", [1, 4])
@pytest.mark.parametrize("name", sorted(VARIANT_CASES))
def test_a_variant_case_blocked_is_the_full_oracle_and_model(name, block, dtype):
    case = variant_case(name)
    arrays = [case.get(n) for n in oracle_blocked.ARRAY_ARGUMENTS]
    options = {n: x for n, x in case.items() if n not in oracle_blocked.ARRAY_ARGUMENTS}
    for policy in POLICIES:
        expected, allowed = oracle_blocked.case_with_allowed(case, dtype, policy, block=block)
        assert_close(expected, oracle.sdpa(*arrays, policy, **options))
        rtol = RTOL_SIXTEEN_BIT if tolerances.is_sixteen_bit(dtype) else RTOL
        assert_close(allowed, np.broadcast_to(tolerances.sdpa_allowed(*arrays, dtype, policy, **options),
                                              expected.shape), rtol)
    full = oracle.fully_masked_rows(case["q"], case["k"], case.get("mask"), case["is_causal"], **options)
    assert np.array_equal(oracle_blocked.case_fully_masked_rows(case, block), full)
    if name in ("bool-mask-window", "offset-window"):
        assert full.any(), "the case meant to hold rows without keys has none"


def test_a_block_moves_the_query_offset_and_counts_query_lengths_from_its_first_row():
    case = variant_case("lengths") | {"query_offset": 2, "mask": np.zeros((9, 11), dtype=bool)}
    part = oracle_blocked.rows_of(case, slice(4, 8))
    assert part["q"].shape[2] == 4 and part["mask"].shape == (4, 11) and part["query_offset"] == 6
    assert part["query_lengths"].tolist() == [4, 1] and part["k"] is case["k"]


@pytest.mark.parametrize("alignment", ["bottom-right", "top-left"])
@pytest.mark.parametrize("which", ["varlen", "paged"])
def test_a_packed_or_paged_case_blocked_is_the_full_oracle_and_model(which, alignment):
    from attention_conformance.conformance.judging.expected import (
        allowed_error,
        expected_output,
        sequence_fully_masked_rows,
    )

    from .test_varlen_paged import packed_case, paged_case

    extra = dict(is_causal=True, window=(1, 0), learnable_sink=np.array([0.3, -0.2]), softcap=4.0)
    for options in ({"is_causal": True}, extra):
        case = packed_case(**options) if which == "varlen" else paged_case(**options)
        for dtype in ("float32", "bfloat16"):
            want, allowed, empty = oracle_blocked.sequences_with_allowed(case.op, case.inputs, dtype, "zeros",
                                                                         alignment=alignment, block=1)
            assert_close(want, expected_output(case, case.inputs, "zeros", alignment))
            assert_close(allowed, np.broadcast_to(allowed_error(case, case.inputs, dtype, "zeros",
                                                                alignment=alignment), want.shape), RTOL_SIXTEEN_BIT)
            assert np.array_equal(empty, sequence_fully_masked_rows(case.op, case.inputs, alignment))


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(case=sdpa_cases(allow_empty_rows=True), dtype=st.sampled_from(["float64", "float32", "float16"]))
def test_the_oracle_and_the_bound_never_write_into_their_inputs(case, dtype):
    """They get the case's float64 inputs as they are, not copies (cases.widen, oracle._f64): read-only here, so
    a write into one raises."""
    from attention_conformance.conformance.judging.expected import allowed_error, expected_output

    inputs = case.rounded(dtype)
    for value in inputs.values():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    want = expected_output(case, inputs)
    assert want.shape == inputs["q"].shape[:-1] + inputs["v"].shape[-1:]
    assert allowed_error(case, inputs, dtype).shape[-1] in (1, want.shape[-1])

"""The suite's oracle against ONNX's own backend node tests for Attention (conformance/onnx_attention.py).

Needs the onnx package (the `onnx` extra; CI installs `all`). Without it these tests
skip, unless ATTENTION_CONFORMANCE_REQUIRE_ONNX=1 (set by CI), which makes a missing
onnx a failure rather than a silent skip. The mapping's own rules are checked on
synthetic cases without onnx.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from attention_conformance.conformance.cases import onnx_attention as oa
from attention_conformance.implementations.arrays import numpy_dtype

# ONNX's cases the contract cannot express, with the reason the mapping gives (onnx 1.23.2: 2 of 93).
OUT_OF_CONTRACT = {
    "test_attention_4d_causal_padded_kv_bf16": "negative positions",
    "test_attention_4d_causal_nonpad_negative_offset_structural_empty": "negative positions",
}
MIN_IN_CONTRACT = 60


@pytest.fixture(scope="module")
def onnx_cases():
    try:
        import onnx  # noqa: F401
    except ImportError:
        if os.environ.get("ATTENTION_CONFORMANCE_REQUIRE_ONNX") == "1":
            pytest.fail(f"ATTENTION_CONFORMANCE_REQUIRE_ONNX=1 but onnx is not installed (pip install "
                        f"'{oa.ONNX_REQUIREMENT}', or the package's `onnx` extra)")
        pytest.skip(f"onnx is not installed ({oa.ONNX_REQUIREMENT}; the `onnx` extra)")
    return oa.collect()


def test_enough_onnx_cases_are_in_contract(onnx_cases):
    in_contract = [c for c in onnx_cases if c.in_contract]
    assert len(in_contract) >= MIN_IN_CONTRACT, (
        f"only {len(in_contract)} of {len(onnx_cases)} ONNX Attention cases map onto the contract")


def test_every_in_contract_onnx_case_agrees_with_the_oracle(onnx_cases):
    problems = [p for c in onnx_cases if c.in_contract for p in [oa.disagreement(c)[1]] if p]
    assert not problems, f"{len(problems)} ONNX case(s) disagree with the oracle:\n" + "\n".join(problems)


def test_out_of_contract_cases_are_the_known_ones(onnx_cases):
    """A new ONNX version's cases are mapped or named here; the mapping never drops a case silently."""
    out = {c.name: c.reason for c in onnx_cases if not c.in_contract}
    unexplained = {n: r for n, r in out.items() if n not in OUT_OF_CONTRACT or OUT_OF_CONTRACT[n] not in r}
    assert not unexplained, f"ONNX cases outside the contract without a known reason: {unexplained}"


def test_fixture_files_hold_onnx_s_tensors(onnx_cases):
    """fixtures/onnx_attention*.yaml are what the converter writes from this onnx (inputs and expected Y)."""
    from attention_conformance.conformance.cases.fixtures import fixtures

    by_id = {}
    for case in onnx_cases:
        for part in case.parts:
            by_id[oa.fixture_id(case.name, part, len(case.parts))] = (case, part)
    written = [fx for fx in fixtures() if fx.id.startswith("onnx-")]
    assert written, "no onnx-* fixtures loaded"
    for fx in written:
        case, part = by_id[fx.id]
        if fx.document != f"onnx-{oa.onnx_version()}/onnx/backend/test/case/node/attention.py":
            pytest.skip(f"fixtures were written from {fx.document}, this is onnx {oa.onnx_version()}")
        for name, value in part.inputs.items():
            got = fx.inputs[name]
            if isinstance(value, np.ndarray):
                kind = numpy_dtype(case.dtype) if value.dtype.kind == "f" else value.dtype
                assert np.array_equal(np.asarray(got).astype(kind), value.astype(kind)), f"{fx.id}: inputs.{name}"
            else:
                assert tuple(got) == tuple(value) if isinstance(value, tuple) else got == value, f"{fx.id}: {name}"
        # ONNX computes its expected Y when the cases are collected, with this machine's NumPy and BLAS: float32
        # matmuls summed in another order differ in the last bits (measured: 2 ulps with numpy 2.4.6 and this
        # machine's OpenBLAS, against the file written elsewhere). The inputs above are equal bit for bit; Y to
        # within 8 units in the last place of its dtype.
        kind = numpy_dtype(case.dtype)
        written_y, onnx_y = fx.expected.astype(kind), part.expected.astype(kind)
        ulps = 8 * np.spacing(np.maximum(np.abs(written_y), np.abs(onnx_y)).astype(kind)).astype(np.float64)
        assert np.all(np.abs(written_y.astype(np.float64) - onnx_y.astype(np.float64)) <= ulps), f"{fx.id}: expected"


# ------------------------------------------------------------------ the mapping's rules, no onnx needed
def _tensors(rng, *shapes):
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_packed_3d_inputs_become_heads():
    rng = np.random.default_rng(0)
    q, k, v = _tensors(rng, (1, 3, 2 * 4), (1, 5, 4), (1, 5, 6))
    y = rng.standard_normal((1, 3, 2 * 6)).astype(np.float32)
    case = oa.map_case("t", 23, {"q_num_heads": 2, "kv_num_heads": 1}, {"Q": q, "K": k, "V": v}, {"Y": y})
    (part,) = case.parts
    assert part.inputs["q"].shape == (1, 2, 3, 4) and part.inputs["v"].shape == (1, 1, 5, 6)
    # head h of row i is columns h*D .. h*D + D - 1 of the packed row
    assert np.array_equal(part.inputs["q"][0, 1, 2], q[0, 2, 4:8])
    assert np.array_equal(part.expected[0, 1, 2], y[0, 2, 6:12])


def test_past_keys_set_the_query_offset_only_where_positions_matter():
    rng = np.random.default_rng(1)
    q, k, v, pk, pv = _tensors(rng, (1, 1, 2, 4), (1, 1, 3, 4), (1, 1, 3, 4), (1, 1, 5, 4), (1, 1, 5, 4))
    ins = {"Q": q, "K": k, "V": v, "past_key": pk, "past_value": pv}
    y = {"Y": np.zeros((1, 1, 2, 4), np.float32), "present_key": pk, "present_value": pv}
    causal = oa.map_case("t", 24, {"is_causal": 1}, ins, y)
    plain = oa.map_case("t", 24, {}, ins, y)
    assert causal.parts[0].inputs["query_offset"] == 5 and "query_offset" not in plain.parts[0].inputs
    assert np.array_equal(causal.parts[0].inputs["k"][:, :, :5], pk)
    assert causal.unjudged == ("present_key", "present_value")


def test_short_masks_are_padded_as_onnx_pads_them():
    rng = np.random.default_rng(2)
    q, k, v = _tensors(rng, (2, 1, 2, 4), (2, 1, 5, 4), (2, 1, 5, 4))
    y = {"Y": np.zeros((2, 1, 2, 4), np.float32)}
    boolean = oa.map_case("t", 24, {}, {"Q": q, "K": k, "V": v, "attn_mask": np.ones((2, 3), bool)}, y)
    additive = oa.map_case("t", 24, {}, {"Q": q, "K": k, "V": v, "attn_mask": np.zeros((2, 3), np.float32)}, y)
    assert boolean.parts[0].inputs["mask"].shape == (1, 1, 2, 5)
    assert not boolean.parts[0].inputs["mask"][..., 3:].any()
    assert np.all(np.isneginf(additive.parts[0].inputs["mask"][..., 3:]))


def test_per_example_cache_lengths_split_the_batch():
    rng = np.random.default_rng(3)
    q, k, v = _tensors(rng, (2, 1, 2, 4), (2, 1, 6, 4), (2, 1, 6, 4))
    y = {"Y": rng.standard_normal((2, 1, 2, 4)).astype(np.float32)}
    ins = {"Q": q, "K": k, "V": v, "nonpad_kv_seqlen": np.array([3, 6])}
    split = oa.map_case("t", 24, {"is_causal": 1}, ins, y)
    assert [p.inputs["query_offset"] for p in split.parts] == [1, 4]
    assert [p.inputs["key_lengths"].tolist() for p in split.parts] == [[3], [6]]
    assert np.array_equal(split.parts[1].expected, y["Y"][1:2])
    plain = oa.map_case("t", 24, {}, ins, y)  # no causal band, no window: one part, key lengths only
    assert len(plain.parts) == 1 and "query_offset" not in plain.parts[0].inputs
    short = oa.map_case("t", 24, {"is_causal": 1}, dict(ins, nonpad_kv_seqlen=np.array([1, 6])), y)
    assert not short.in_contract and "negative positions" in short.reason


def test_windows_and_softcap_map_onto_the_keywords():
    rng = np.random.default_rng(4)
    q, k, v = _tensors(rng, (1, 1, 3, 4), (1, 1, 3, 4), (1, 1, 3, 4))
    y = {"Y": np.zeros((1, 1, 3, 4), np.float32)}
    case = oa.map_case("t", 25, {"left_window_size": 2, "right_window_size": -1, "softcap": 0.5},
                       {"Q": q, "K": k, "V": v}, y)
    assert case.parts[0].inputs["window"] == (2, None) and case.parts[0].inputs["softcap"] == 0.5
    none = oa.map_case("t", 25, {"left_window_size": -1, "right_window_size": -1, "softcap": 0.0},
                       {"Q": q, "K": k, "V": v}, y)
    assert "window" not in none.parts[0].inputs and "softcap" not in none.parts[0].inputs

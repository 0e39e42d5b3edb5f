"""FP8 attention checks itself: the oracle's dequantization, the contract's 8-bit declarations, which
items collection gives an implementation, the array conversion, the 8-bit tolerance against correct and wrong
pipelines, and the fixture loader's checks of FP8 fixtures."""
from __future__ import annotations

import inspect
import textwrap
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from attention_conformance.conformance import plugin
from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.fixtures import fixtures, load_fixture_file
from attention_conformance.conformance.cases.fp8 import quantized
from attention_conformance.conformance.judging.messages import ConformanceFailure, repro
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import oracle, tolerances
from attention_conformance.conformance.specdata import SpecError, clauses
from attention_conformance.conformance.test_fp8 import needs_descales
from attention_conformance.implementations.arrays import ARRAY_KINDS, DTYPE_NAMES, EIGHT_BIT_DTYPE_NAMES
from attention_conformance.implementations.registry import ImplementationLoadError, from_object
from zoo import correct_fp8_fa3_emulation as fa3

pytestmark = pytest.mark.selfcheck
E4M3, E5M2 = EIGHT_BIT_DTYPE_NAMES


def _case(rng, fmt=E4M3, b=2, hq=4, hkv=2, lq=3, lk=5, d=4, forms=("calibrated", "calibrated", "calibrated")):
    inputs = {"q": rng.standard_normal((b, hq, lq, d)), "k": rng.standard_normal((b, hkv, lk, d)),
              "v": rng.standard_normal((b, hkv, lk, d))}
    for name, form in zip("qkv", forms):
        inputs[name], inputs[f"{name}_descale"] = quantized(inputs[name], hkv, form, fmt, rng)
    return Case("sdpa", inputs, ("sdpa.fp8-descale",), "fp8 self-check case")


def test_the_oracle_reads_q_descale_at_the_kv_head_of_the_group():
    rng = np.random.default_rng(0)
    inputs = _case(rng).inputs
    q, k, v = (inputs[n] for n in "qkv")
    qd, kd, vd = (inputs[f"{n}_descale"] for n in "qkv")
    by_hand = oracle.sdpa(q * np.repeat(qd, 2, axis=1)[:, :, None, None], k * kd[:, :, None, None],
                          v * vd[:, :, None, None])
    assert np.array_equal(oracle.sdpa(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd), by_hand)
    with pytest.raises(ValueError, match=r"q_descale has shape \(2, 4\); \(B, Hkv\) = \(2, 2\) expected"):
        oracle.dequantize(q, k, v, q_descale=np.ones((2, 4)))


def test_eight_bit_dtypes_are_declared_like_the_others():
    def sdpa(q, k, v, *, q_descale=None, k_descale=None, v_descale=None):
        return q

    impl = from_object(type("Fp8", (), {"DTYPES": (E4M3,), "sdpa": staticmethod(sdpa)}), "fp8", "fp8")
    assert impl.dtypes == (E4M3,) and impl.output_dtype(E4M3) == "bfloat16" and impl.output_dtype("float32") == "float32"
    with pytest.raises(ImplementationLoadError, match=r"DTYPES names unknown dtypes \['float8_e4m3'\]; allowed: .*"
                                                      r"'float8_e4m3fn', 'float8_e5m2'"):
        from_object(type("Fp8", (), {"DTYPES": ("float8_e4m3",), "sdpa": staticmethod(sdpa)}), "fp8", "fp8")
    with pytest.raises(ImplementationLoadError, match=r"FP8_OUTPUT_DTYPE='float8_e4m3fn' must be one of"):
        from_object(type("Fp8", (), {"DTYPES": (E4M3,), "FP8_OUTPUT_DTYPE": E4M3, "sdpa": staticmethod(sdpa)}),
                    "fp8", "fp8")


def test_collection_gives_eight_bit_items_only_to_implementations_declaring_them():
    config = SimpleNamespace(getoption=lambda name, default=None: [])
    plain = from_object(type("Plain", (), {"sdpa": staticmethod(lambda q, k, v: q)}), "plain", "plain")
    mixed = from_object(type("Mixed", (), {"DTYPES": ("float32", E5M2), "sdpa": staticmethod(lambda q, k, v: q)}),
                        "mixed", "mixed")
    assert plugin._selected_dtypes(config, plain, "cpu", EIGHT_BIT_DTYPE_NAMES) == []
    assert plugin._selected_dtypes(config, mixed, "cpu") == ["float32"]  # the 16/32/64-bit tests: no 8-bit dtype
    assert plugin._selected_dtypes(config, mixed, "cpu", EIGHT_BIT_DTYPE_NAMES) == [E5M2]
    fp8_fixtures = [fx for fx in fixtures() if fx.dtypes]
    assert fp8_fixtures and all(fx.runs_in(E4M3) and not fx.runs_in("float32") for fx in fp8_fixtures)
    assert not any(fx.runs_in(E4M3) for fx in fixtures() if not fx.dtypes)
    assert set(DTYPE_NAMES).isdisjoint(EIGHT_BIT_DTYPE_NAMES)


@pytest.mark.parametrize("dtype", EIGHT_BIT_DTYPE_NAMES)
def test_torch_gets_the_same_float8_bytes(dtype):
    pytest.importorskip("torch")
    values = np.array([0.0, -0.0, 1.0, -1.5, 2.0**-9, 448.0 if dtype == E4M3 else 57344.0, -3.25]).astype(
        getattr(ml_dtypes, dtype))
    adapter = ARRAY_KINDS["torch"]
    native = adapter.to_native(values, "cpu")
    assert str(native.dtype) == f"torch.{dtype}"
    back = adapter.to_numpy(native)
    assert back.dtype == values.dtype and np.array_equal(back.view(np.uint8), values.view(np.uint8))


def _ratio(got, case, fmt):
    inputs = case.rounded(fmt)
    q, k, v = oracle.dequantize(*(inputs[n] for n in "qkv"), *(inputs[f"{n}_descale"] for n in "qkv"))
    want = oracle.sdpa(q, k, v)
    allowed = tolerances.sdpa_allowed(q, k, v, None, False, None, fmt, output_dtype="bfloat16")
    return float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want) / allowed))


def _fa3(case, fmt, **steps):
    inputs = case.rounded(fmt)
    return fa3.attend(inputs["q"], inputs["k"], inputs["v"], q_descale=inputs["q_descale"],
                      k_descale=inputs["k_descale"], v_descale=inputs["v_descale"], **steps)


@pytest.mark.parametrize("fmt", EIGHT_BIT_DTYPE_NAMES)
def test_the_eight_bit_tolerance_holds_fa3s_pipeline_and_rejects_wrong_ones(fmt):
    """spec/tolerances.yaml, eight_bit: FlashAttention 3's pipeline (P rounded to 8 bits) and one keeping P in
    float32 use a small part of the allowance, also on a long cache of flat weights (q small) and with every form of
    factors; zeros, a descale applied twice, and P rounded after normalisation (FlashAttention 3's test reference,
    attention_ref(intermediate_dtype=float8)) on a long flat row are rejected."""
    rng = np.random.default_rng(1)
    for forms in (("calibrated",) * 3, ("one", "large", "small"), ("per-tensor", "calibrated", "large")):
        case = _case(rng, fmt, forms=forms)
        assert _ratio(_fa3(case, fmt), case, fmt) < 0.5
        assert _ratio(_fa3(case, fmt, round_p=lambda p, f: p), case, fmt) < 0.5
        assert _ratio(np.zeros((2, 4, 3, 4)), case, fmt) > 1
    twice = lambda *a: tuple(x * x for x in fa3.descale_factors(*a))  # noqa: E731
    case = _case(rng, fmt)
    assert _ratio(_fa3(case, fmt, factors=twice), case, fmt) > 1
    long = _case(rng, fmt, b=1, hq=2, hkv=1, lq=1, lk=2048, d=64, forms=("one", "calibrated", "calibrated"))
    long.inputs["q"] = long.inputs["q"] * 2.0**-6  # nearly equal weights: every one about 1 / 2048
    assert _ratio(_fa3(long, fmt), long, fmt) < 0.5

    if fmt == E4M3:  # e5m2's subnormals reach 2^-16: weights of 2^-11 survive there
        inputs = long.rounded(fmt)
        q, k, v = oracle.dequantize(*(inputs[n] for n in "qkv"), *(inputs[f"{n}_descale"] for n in "qkv"))
        weights = oracle.attention_weights(q, np.repeat(k, 2, axis=1)).astype(np.float32)
        rounded = weights.astype(getattr(ml_dtypes, fmt)).astype(np.float64)  # the normalised P in 8 bits
        assert _ratio(rounded @ np.repeat(v, 2, axis=1), long, fmt) > 1


def test_an_eight_bit_case_must_come_back_in_fp8_output_dtype():
    fx = next(fx for fx in fixtures() if fx.id == "fp8-descale-per-kv-head")

    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, q_descale=None, k_descale=None, v_descale=None):
        return np.asarray(oracle.sdpa(q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale),
                          dtype=np.float32)

    impl = from_object(type("F32Out", (), {"DTYPES": (E4M3,), "sdpa": staticmethod(sdpa)}), "f32_out", "f32_out")
    judge = Judge(impl, E4M3, "cpu", "self-check")
    case = Case("sdpa", dict(fx.inputs), fx.clauses, fx.id)
    with pytest.raises(ConformanceFailure, match=r"(?s)\[sdpa.fp8-output-dtype\].*output dtype float32, expected "
                                                 r"bfloat16 \(FP8_OUTPUT_DTYPE of float8_e4m3fn inputs"):
        judge.check(case)


def test_a_repro_snippet_rebuilds_the_8bit_inputs_and_their_factors(capsys):
    """The printed repro holds q, k, v in ml_dtypes' float8 and the descale factors in float32, and runs."""
    fx = next(fx for fx in fixtures() if fx.id == "fp8-descale-per-kv-head")
    inputs = Case("sdpa", dict(fx.inputs), fx.clauses, fx.id).rounded(E4M3)
    snippet = repro("zoo.broken_fp8_descale_twice", "sdpa", inputs, E4M3, "cpu")
    assert "q = np.array([[[[0.0]], [[0.0]]]]).astype(ml_dtypes.float8_e4m3fn)" in snippet
    assert "v_descale = np.array([[2.0, 0.5]], dtype=np.float32)" in snippet
    exec(compile(snippet, "<repro>", "exec"), {})  # noqa: S102 -- the suite's own snippet
    printed = capsys.readouterr().out
    assert "max abs error 4.0" in printed  # head 0: 8 against 4


def test_without_descale_keywords_the_eight_bit_tests_do_not_apply():
    impl = from_object(type("NoDescales", (), {"DTYPES": (E4M3,), "sdpa": staticmethod(lambda q, k, v: q)}),
                       "no_descales", "no_descales")
    assert needs_descales()(impl) == ("unsupported: no_descales.sdpa has no 'q_descale', 'k_descale', 'v_descale' "
                                      "parameter")


FP8_FIXTURE = """
document: hand-worked/fp8
title: test
fixtures:
  - id: fp8-tiny
    kind: example
    op: sdpa
    clauses: [sdpa.fp8-descale]
    dtypes: [float8_e4m3fn, float8_e5m2]
    source: "hand-worked"
    inputs:
      q: [[[[0.0]]]]
      k: [[[[0.0], [0.0]]]]
      v: [[[[VALUE], [3.0]]]]
      v_descale: [[2.0]]
      DESCALES
    expected: [[[[EXPECTED]]]]
    tolerance: {atol: 1.0e-9, reason: "exact values, nothing rounded"}
"""


@pytest.mark.parametrize("value, expected, descales, dtypes, words", [
    ("1.125", "4.125", "", "[float8_e4m3fn, float8_e5m2]",
     "field 'inputs.v': values not exactly representable in float8_e5m2"),
    ("1.0", "4.0", "k_descale: [[1.0, 1.0]]", "[float8_e4m3fn]",
     r"field 'inputs.k_descale': \[\[1.0, 1.0\]\]: \(B, Hkv\) = \(1, 1\) finite float32 values expected"),
    ("1.0", "4.0", "", None, "field 'inputs.v_descale': descale factors need `dtypes`"),
])
def test_a_defective_fp8_fixture_names_its_field(tmp_path, value, expected, descales, dtypes, words):
    text = FP8_FIXTURE.replace("VALUE", value).replace("EXPECTED", expected).replace("DESCALES", descales)
    text = text.replace("[float8_e4m3fn, float8_e5m2]", dtypes) if dtypes else text.replace(
        "    dtypes: [float8_e4m3fn, float8_e5m2]\n", "")
    path = tmp_path / "fixture.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(SpecError, match=f"entry 'fp8-tiny': {words}"):
        load_fixture_file(path, clauses())
    good = FP8_FIXTURE.replace("VALUE", "1.0").replace("EXPECTED", "4.0").replace("DESCALES", "")
    path.write_text(textwrap.dedent(good))
    assert load_fixture_file(path, clauses())[0].dtypes == (E4M3, E5M2)


def test_an_eight_bit_case_takes_its_float_mask_in_float32_and_a_mask_before_the_descales_fails():
    """A float mask of an 8-bit case reaches the implementation, the oracle and the repro in float32 (the formats
    hold no -inf), and the 8-bit property draws it: a kernel that added it to the raw q.k before the descales
    (multiplying it by them) passed default runs that drew no float mask."""
    from attention_conformance.conformance.cases import fp8

    assert "float" in inspect.signature(fp8.fp8_cases).parameters["mask_kinds"].default
    rng = np.random.default_rng(5)
    case = _case(rng, b=1, hq=2, hkv=1, lq=2, lk=4)
    mask = np.where(rng.random((1, 2, 2, 4)) < 0.7, rng.standard_normal((1, 2, 2, 4)), -np.inf)
    mask[..., 0] = 1.5
    case.inputs["mask"] = mask
    assert case.inputs["q_descale"].flat[0] * case.inputs["k_descale"].flat[0] != 1.0  # the bug changes the mask
    rounded = case.rounded(E4M3)
    assert rounded["mask"].dtype == np.float32 and np.array_equal(rounded["mask"], mask.astype(np.float32))
    snippet = repro("zoo.correct_fp8_fa3_emulation", "sdpa", rounded, E4M3, "cpu")
    assert "mask = np.array(" in snippet and "dtype=np.float32)" in snippet.split("mask = ", 1)[1].split("\n", 1)[0]

    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, q_descale=None, k_descale=None, v_descale=None):
        factor = float(np.asarray(q_descale).flat[0] * np.asarray(k_descale).flat[0])
        wrong = None if mask is None else np.asarray(mask, dtype=np.float64) * factor  # added before the descales
        return np.asarray(oracle.sdpa(q, k, v, wrong, is_causal, scale, q_descale=q_descale, k_descale=k_descale,
                                      v_descale=v_descale), dtype=ml_dtypes.bfloat16)

    impl = from_object(type("MaskFirst", (), {"DTYPES": (E4M3,), "sdpa": staticmethod(sdpa)}), "mask_first", "x")
    with pytest.raises(ConformanceFailure):
        Judge(impl, E4M3, "cpu", "self-check").check(case)


def test_small_weights_beside_a_dominant_key_survive_fa3s_offset_and_flush_without_it():
    """Against 1023 keys 7.5 below one dominant key (a case of test_fp8_small_weights_beside_a_dominant_key), P =
    2^8 e^(s - m) keeps the small weights normal in float8_e4m3fn and FlashAttention 3's pipeline stays well inside
    the allowance; P = e^(s - m) rounded flushes them to 0 (zoo/broken_fp8_p_without_offset) and is rejected."""
    from attention_conformance.conformance.cases.fp8 import _dominant_key
    from zoo import broken_fp8_p_without_offset as no_offset

    rng = np.random.default_rng(2)
    inputs = {"q": rng.standard_normal((1, 2, 1, 64)), "k": rng.standard_normal((1, 1, 5, 64)),
              "v": rng.standard_normal((1, 1, 5, 64))}
    draws = iter([1024, 5, 7.5, 3])  # the keys, the values seed, the gap, the dominant key
    words = _dominant_key(lambda strategy, label: next(draws), inputs, E4M3)
    assert words == "dominant key 3, the others 7.5 below" and inputs["k"].shape == (1, 1, 1024, 64)
    for name in "qkv":
        inputs[name], inputs[f"{name}_descale"] = quantized(inputs[name], 1, "one", E4M3, rng)
    case = Case("sdpa", inputs, ("sdpa.fp8-descale",), "dominant key")
    assert _ratio(_fa3(case, E4M3), case, E4M3) < 0.5
    assert _ratio(_fa3(case, E4M3, round_p=no_offset.round_p_without_offset), case, E4M3) > 3

"""What a failure says: the clause the values break, and a repro that shows the failure."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging import records
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.implementations.registry import from_object, load_implementation

ROOT = Path(__file__).resolve().parents[1]


def failure_of(spec: str, case: Case, dtype: str = "float64") -> tuple[ConformanceFailure, str]:
    """The failure of implementation ``spec`` on ``case``, and the repro its message would print."""
    judge = Judge(load_implementation(spec), dtype, "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    return raised.value, judge._snippet(case, case.inputs)


def sdpa_case(clauses, **options) -> Case:
    rng = np.random.default_rng(7)
    inputs = {"q": rng.standard_normal((1, 1, 3, 4)), "k": rng.standard_normal((1, 1, 5, 4)),
              "v": rng.standard_normal((1, 1, 5, 2)), **options}
    return Case("sdpa", inputs, clauses, "three queries, five keys")


@pytest.mark.parametrize("spec, clauses, options, expected", [
    # A case listed first under its shape clause: off in its values, it breaks the next clause listed.
    ("zoo.broken_scale_ignored", ("sdpa.output-shape", "sdpa.scale-explicit"), {"scale": 1.5}, "sdpa.scale-explicit"),
    # Only clauses with checks of their own: the values break the definition (a softmax over the wrong
    # axis: no feature of the case taken out makes it pass, so the blame stays with the definition).
    ("zoo.broken_sdpa_softmax_axis", ("mask.fully-masked-row", "sdpa.finite"), {}, "sdpa.definition"),
    # A clause about values listed first keeps the failure.
    ("zoo.broken_sdpa_no_scale", ("sdpa.scale-default", "sdpa.output-shape"), {}, "sdpa.scale-default"),
])
def test_an_error_beyond_the_tolerance_is_filed_under_a_clause_about_values(spec, clauses, options, expected,
                                                                            kept_records):
    failure, _ = failure_of(spec, sdpa_case(clauses, **options))
    assert failure.clause == expected
    assert f"[{expected}]" in str(failure) and "exceeds the allowed error" in str(failure)


def test_the_repro_of_a_non_finite_output_shows_it(kept_records):
    """np.nanmax would print the error of the finite elements only, hiding the failure."""
    x = np.array([[800.0, 0.0, -3.0], [1.0, 2.0, 3.0]])
    case = Case("softmax", {"x": x}, ("softmax.large-inputs",), "one row above exp's range")
    failure, snippet = failure_of("zoo.broken_softmax_no_max_sub", case)
    assert failure.clause == "softmax.large-inputs"
    done = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "max abs error nan" in done.stdout, done.stdout
    assert "non-finite where the oracle is finite 1" in done.stdout, done.stdout


def test_the_repro_of_a_correct_implementation_prints_zero_error(kept_records):
    from attention_conformance.conformance.judging.messages import repro

    x = np.array([[800.0, 0.0, -np.inf], [1.0, 2.0, 3.0]])
    snippet = repro("builtin:numpy_native", "softmax", {"x": x}, "float64", "cpu")
    done = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["max abs error 0.0", "non-finite where the oracle is finite 0"], done.stdout


def test_a_score_lost_to_a_large_float_mask_is_not_blamed_on_a_correct_bfloat16_path(kept_records):
    """Found by a default run: every key of a row offset by -1e9, whose bfloat16 spacing (4e6) swallows the
    scores (-147, 511, -198), so a correct bfloat16 path may return any mix of those keys' values. The 16-bit
    bound once clipped the score error at e^700 and allowed key 2 (weight 1e-308) a change of 1e-4 only."""
    q = np.zeros((1, 1, 1, 2))
    q[..., 0] = 1.0
    k = np.array([[[[-147.0, 0.0], [511.0, 0.0], [-198.0, 0.0]]]]) * np.sqrt(2.0)
    v = np.array([[[[-1.0], [-1.0], [3.0]]]])
    case = Case("sdpa", {"q": q, "k": k, "v": v, "mask": np.full((1, 1, 1, 3), -1e9)}, ("sdpa.definition",),
                "row offset by -1e9", mask_kind="float")
    judge = Judge(load_implementation("builtin:numpy_native"), "bfloat16", "cpu")
    judge.check(case)  # the weights become uniform in bfloat16: (-1 - 1 + 3) / 3 against the oracle's -1


@pytest.mark.parametrize("name", ["builtin:numpy_native", "builtin:torch_math"])
def test_a_key_whose_float64_weight_underflows_still_counts_under_a_large_bfloat16_mask(kept_records, name):
    """Found by a default run (torch_math and jax_numpy failed 409x): scores 331 and -1053 under a float mask of
    -1e9 on both keys. The second key's weight, e^-1384, is 0 in float64, and the 16-bit bound once counted only
    keys of weight > 0; in bfloat16 the mask swallows both scores and the weights become (1/2, 1/2)."""
    if name.endswith("torch_math"):
        pytest.importorskip("torch")
    q = np.zeros((1, 1, 1, 2))
    q[..., 0] = 1.0
    k = np.array([[[[330.7, 0.0], [-1053.1, 0.0]]]]) * np.sqrt(2.0)
    v = np.array([[[[-1.0], [3.0]]]])
    case = Case("sdpa", {"q": q, "k": k, "v": v, "mask": np.full((1, 1, 1, 2), -998244352.0)}, ("sdpa.definition",),
                "row offset by -1e9, second weight below float64's range", mask_kind="float")
    Judge(load_implementation(name), "bfloat16", "cpu").check(case)


def gradient_failure(spec: str):
    """The failure (pytest's ExceptionInfo) of a torch implementation's gradients on a small case."""
    pytest.importorskip("torch")
    from attention_conformance.conformance.judging.gradient_verdicts import GradientJudge, judge_gradients

    case = sdpa_case(("grad.sdpa-q",))
    case.inputs["d_out"] = np.random.default_rng(8).standard_normal((1, 1, 3, 2))
    judge = GradientJudge(load_implementation(spec), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge_gradients(judge, case, case.rounded("float64"))
    return raised


def test_a_gradient_beyond_its_tolerance_is_kept_with_its_ratio(kept_records):
    """A failed gradient case carries its error, allowed error and ratio, so the report's plot draws it above 1."""

    raised = gradient_failure("zoo.broken_backward_dk_no_scale")
    record = raised.value.record
    assert raised.value.clause == "grad.sdpa-k" and record.status == "failed"
    assert record.ratio > 1 and record.max_abs_error > record.allowed > 0
    assert [rec for rec in records.RECORDS if rec.status == "failed"] == [record]


def test_a_nan_gradient_is_named_as_non_finite(kept_records):
    """Not an error 'beyond the tolerance': the count of NaN elements, the first one, and the analytic value there."""
    raised = gradient_failure("tests.nan_standins:TorchNaNGradient")
    assert raised.value.clause == "grad.sdpa-q"
    message = str(raised.value)
    assert "dq = dL/dq: 12 non-finite element(s) where the analytic backward is finite" in message  # (1, 1, 3, 4)
    assert "dq index (0, 0, 0, 0): got nan, analytic backward" in message


class _OutputBiasPerHead:
    """multi_head_attention projecting the output head by head and adding b_o once per head (num_heads times)."""

    DTYPES = ("float64",)

    @staticmethod
    def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
        from zoo import _reference as ref

        out = ref.multi_head_attention(query, key, value, params, num_heads, mask, is_causal)
        return out + (num_heads - 1) * params["b_o"] if params.get("b_o") is not None else out


def test_an_output_bias_fault_met_by_a_case_drawn_for_another_mha_clause_is_the_output_projections():
    """Such a bug failed every MHA test whose case had b_o and was filed under ten clauses; the case passes without
    b_o, so it is mha.output-projection's."""
    rng = np.random.default_rng(5)
    params = {"w_q": rng.standard_normal((8, 8)), "w_k": rng.standard_normal((8, 8)), "w_v": rng.standard_normal((8, 8)),
              "w_o": rng.standard_normal((8, 8)), "b_o": rng.standard_normal(8)}
    x = rng.standard_normal((1, 3, 8))
    case = Case("multi_head_attention", {"query": x, "key": x, "value": x, "params": params, "num_heads": 2},
                ("mha.head-split",), "B1 L3 E8 H2 bias=output (hand-made)")
    judge = Judge(from_object(_OutputBiasPerHead, "output_bias_per_head", "tests:output_bias_per_head"), "float64",
                  "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    assert raised.value.clause == "mha.output-projection", str(raised.value)

"""MHA variants and variant gradients: multi_head_attention takes sdpa's variant keywords (mha.variants), and the
variants' gradients are checked against the analytic float64 backward (grad.softcap, grad.variants,
grad.learnable-sink).

What is checked here: the keywords reach an MHA implementation only when used and in the contract's dtypes, a
signature without one makes the case unsupported; padding rows and per-head rows without keys of an MHA output are
judged as sdpa's are; an MHA bug is filed under the keyword's own clause; the analytic backward of every variant
(dsink included) agrees with torch's float64 autograd; the gradient tolerance of a case without variants is exactly
what it was, and the variants only add; a variant backward bug is filed under its gradient clause with a repro that
runs."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.gradients import backward_allowed
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import backward as oracle_backward
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.registry import load_implementation
from zoo import correct_mha_variants_loop as loop

pytestmark = [pytest.mark.selfcheck, pytest.mark.usefixtures("kept_records")]
ROOT = Path(__file__).resolve().parent.parent


def mha_case(clause: str = "mha.variants", heads: int = 2, **extra) -> Case:
    rng = np.random.default_rng(3)
    e, width = 4, 2
    params = {f"w_{n}": rng.standard_normal((e, heads * width)) for n in "qkv"}
    params["w_o"] = rng.standard_normal((heads * width, e))
    x, kv = rng.standard_normal((2, 5, e)), rng.standard_normal((2, 6, e))
    inputs = {"query": x, "key": kv, "value": rng.standard_normal((2, 6, e)), "params": params, "num_heads": heads,
              **extra}
    return Case("multi_head_attention", inputs, (clause,), f"mha case for {clause}")


class Recorder:
    """The correct head loop (float64 inside, any dtype out), remembering the keywords it was given."""

    DTYPES = ("float64", "float32", "float16", "bfloat16")
    seen: dict = {}

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             alibi_slopes=None, learnable_sink=None, query_lengths=None, key_lengths=None):
        cls.seen = dict(window=window, alibi_slopes=alibi_slopes, learnable_sink=learnable_sink,
                        query_lengths=query_lengths, key_lengths=key_lengths)
        return loop.multi_head_attention(query, key, value, params, num_heads, mask, is_causal, window=window,
                                         alibi_slopes=alibi_slopes, learnable_sink=learnable_sink,
                                         key_lengths=key_lengths)


class NanPaddingRows(Recorder):
    """Writes NaN into the padding rows i >= query_lengths[b] (unspecified: allowed)."""

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *,
                             query_lengths=None, key_lengths=None):
        out = loop.multi_head_attention(query, key, value, params, num_heads, mask, is_causal, key_lengths=key_lengths)
        return np.where(oracle.mha_judged_rows(query, query_lengths), out, np.nan).astype(query.dtype)


@pytest.mark.parametrize("dtype, own", [("float32", np.float32), ("bfloat16", np.float32), ("float64", np.float64)])
def test_mha_keywords_reach_the_implementation_in_the_contracts_dtypes(dtype, own):
    case = mha_case(window=(1, 0), alibi_slopes=np.array([0.5, 0.25]), learnable_sink=np.array([0.0, 1.0]),
                    key_lengths=np.array([4, 6]))
    Judge(load_implementation("tests.test_mha_variants_and_gradients:Recorder"), dtype, "cpu").check(case)
    seen = Recorder.seen
    assert seen["window"] == (1, 0) and seen["query_lengths"] is None
    assert seen["alibi_slopes"].dtype == own and seen["learnable_sink"].dtype == own
    assert seen["key_lengths"].dtype == np.int32


def test_mha_keywords_are_passed_only_when_used_and_a_missing_one_is_unsupported():
    impl = load_implementation("tests.test_mha_variants_and_gradients:Recorder")
    Judge(impl, "float64", "cpu").check(mha_case(window=None, query_offset=0))
    assert all(value is None for value in Recorder.seen.values())
    reason = impl.unsupported_reason("multi_head_attention", mha_case(softcap=1.0).rounded("float64"), "float64",
                                     "cpu")
    assert reason and "softcap" in reason
    nn_mha = load_implementation("builtin:torch_nn_mha")
    assert "window" in nn_mha.unsupported_reason("multi_head_attention", mha_case(window=(1, 1)).inputs, "float32",
                                                 "cpu")


def test_mha_padding_rows_are_not_judged_and_heads_rows_without_keys_have_their_cause():
    impl = load_implementation("tests.test_mha_variants_and_gradients:NanPaddingRows")
    judge = Judge(impl, "float64", "cpu")
    case = mha_case(query_lengths=np.array([2, 5]), key_lengths=np.array([0, 6]))
    judge.check(case)  # NaN in example 0's rows 2..4: padding
    inputs = case.rounded("float64")
    assert judge.facts(case, inputs)["fully_masked"]  # example 0 has no key at all
    assert set(judge.row_causes(case, inputs)[0, :, :2].ravel()) == {"key_lengths"}
    assert set(judge.row_causes(case, inputs)[0, :, 2:].ravel()) == {""}  # padding rows are not judged


def test_mha_per_head_parameters_follow_the_head_split():
    """alibi_slopes and learnable_sink are indexed by head h of mha.head-split: the oracle's MHA equals the head
    loop, and reversing the heads' parameters changes the result."""
    slopes, sinks = np.array([0.9, 0.05]), np.array([2.0, -3.0])
    case = mha_case(alibi_slopes=slopes, learnable_sink=sinks, is_causal=True, query_offset=1)
    a = case.inputs
    want = oracle.multi_head_attention(a["query"], a["key"], a["value"], a["params"], 2, None, True,
                                       alibi_slopes=slopes, learnable_sink=sinks, query_offset=1)
    got = loop.multi_head_attention(a["query"], a["key"], a["value"], a["params"], 2, is_causal=True,
                                    alibi_slopes=slopes, learnable_sink=sinks, query_offset=1)
    reversed_ = loop.multi_head_attention(a["query"], a["key"], a["value"], a["params"], 2, is_causal=True,
                                          alibi_slopes=slopes[::-1], learnable_sink=sinks[::-1], query_offset=1)
    assert np.allclose(got, want, rtol=0, atol=1e-12) and not np.allclose(reversed_, want, atol=1e-3)


@pytest.mark.parametrize("member, options, clause", [
    ("broken_mha_window_dropped", {"window": (0, 0), "alibi_slopes": np.array([0.5, 0.1])}, "sdpa.window"),
    ("broken_mha_alibi_scaled", {"alibi_slopes": np.array([0.5, 0.1]), "window": (1, 1)}, "sdpa.alibi"),
])
def test_an_mha_variant_bug_is_filed_under_the_keywords_clause(member, options, clause):
    judge = Judge(load_implementation(f"zoo.{member}"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(mha_case(**options))
    assert raised.value.clause == clause



class FloatMaskBeforeScale(Recorder):
    """Adds the float mask before the scale (an independent MHA did): the mask's values are scaled by 1/sqrt(Dk)."""

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *,
                             learnable_sink=None):
        width = params["w_q"].shape[1] // num_heads
        scaled = None if mask is None or mask.dtype == bool else mask * width ** -0.5  # BUG
        return loop.multi_head_attention(query, key, value, params, num_heads, scaled, is_causal,
                                         learnable_sink=learnable_sink)


def test_a_probe_that_leaves_one_term_a_row_acquits_nothing():
    """One key and a sink: without the sink every weight is 1, whatever the scores and the mask, so that probe passes
    any score fault; the fault is the float mask's, which a row of key and sink still shows (an independent MHA whose
    float mask was added before the scale was filed under sdpa.learnable-sink)."""
    rng = np.random.default_rng(5)
    case = mha_case(learnable_sink=np.array([0.4, -0.2]), mask=rng.standard_normal((1, 2, 5, 1)) * 3)
    case.inputs.update(key=case.inputs["key"][:, :1], value=case.inputs["value"][:, :1])
    judge = Judge(load_implementation("tests.test_mha_variants_and_gradients:FloatMaskBeforeScale"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    assert raised.value.clause == "mask.float-additive"


# ----------------------------------------------------------------- gradients
def grad_inputs(seed: int = 1):
    rng = np.random.default_rng(seed)
    b, hq, hkv, lq, lk, d = 2, 4, 2, 5, 7, 3
    return (rng.standard_normal((b, hq, lq, d)), rng.standard_normal((b, hkv, lk, d)),
            rng.standard_normal((b, hkv, lk, d)), rng.standard_normal((b, hq, lq, d)),
            rng.standard_normal((b, 1, lq, lk)))


VARIANT_SETS = [
    {"softcap": 0.7},
    {"alibi_slopes": np.array([0.9, 0.5, 0.2, 0.05]), "query_offset": 2},
    {"window": (1, 1), "query_offset": 1, "key_lengths": np.array([3, 7], dtype=np.int32)},
    {"learnable_sink": np.array([0.3, -1.0, 2.0, 0.0])},
    {"learnable_sink": np.array([3.0, 1.0, 0.0, -2.0]), "softcap": 1.5, "window": (0, 0), "attention_chunk": 2,
     "key_leftpad": np.array([1, 0], dtype=np.int32), "sink_token_length": 1},
    {"learnable_sink": np.array([0.0, 1.0, 2.0, 3.0]), "key_lengths": np.array([0, 3], dtype=np.int32)},
]


@pytest.mark.parametrize("variants", VARIANT_SETS, ids=lambda v: "+".join(v))
def test_the_analytic_backward_agrees_with_torch_float64_autograd(variants):
    """oracle_backward.sdpa_backward (dq, dk, dv, dmask, dsink) against torch autograd of torch_math in float64:
    docs/gradients.md's derivation, checked."""
    torch = pytest.importorskip("torch")
    from attention_conformance.implementations.builtin.torch_backend import TorchMath

    q, k, v, d_out, mask = grad_inputs()
    leaves = {name: torch.tensor(x, requires_grad=True) for name, x in zip("qkvm", (q, k, v, mask))}
    keywords = {n: torch.tensor(x, requires_grad=n == "learnable_sink") if isinstance(x, np.ndarray) else x
                for n, x in variants.items()}
    out = TorchMath.sdpa(leaves["q"], leaves["k"], leaves["v"], leaves["m"], True, None, **keywords)
    out.backward(torch.tensor(d_out))
    want = oracle_backward.sdpa_backward(q, k, v, d_out, mask, True, None, **variants)
    got = {"dq": leaves["q"].grad, "dk": leaves["k"].grad, "dv": leaves["v"].grad, "dmask": leaves["m"].grad}
    if "learnable_sink" in variants:
        got["dsink"] = keywords["learnable_sink"].grad
    assert set(got) == set(want)
    for name in want:
        assert np.allclose(got[name].numpy(), want[name], rtol=0, atol=1e-13), name


def test_the_gradient_tolerance_without_variants_is_unchanged_and_variants_only_add():
    q, k, v, d_out, mask = grad_inputs(2)
    plain = backward_allowed(q, k, v, d_out, mask, True, None, "float32")
    # Keywords that remove no key take the variants' code paths and leave the allowance bit for bit.
    no_op = backward_allowed(q, k, v, d_out, mask, True, None, "float32", window=(None, None),
                             key_lengths=np.array([7, 7]), query_lengths=np.array([5, 5]))
    assert all(np.array_equal(plain[n], no_op[n]) for n in plain)
    # A sink far below every score changes no weight: the allowance only grows, and barely.
    far = backward_allowed(q, k, v, d_out, mask, True, None, "float32", learnable_sink=np.full(4, -80.0))
    assert set(far) == set(plain) | {"dsink"}
    for name in plain:
        assert (far[name] >= plain[name]).all() and np.allclose(far[name], plain[name], rtol=0.05)
    # softcap far above every score: nearly the identity, never a smaller allowance.
    capped = backward_allowed(q, k, v, d_out, mask, True, None, "float32", softcap=1e4)
    assert all((capped[name] >= plain[name] * (1 - 1e-6)).all() for name in plain)


@pytest.mark.parametrize("member, options, clause", [
    ("broken_backward_softcap_no_derivative", {"softcap": 0.5}, "grad.softcap"),
    ("broken_backward_sink_wrong_sign", {"learnable_sink": np.array([0.5, -0.5, 1.0, 0.0])}, "grad.learnable-sink"),
    ("broken_backward_sink_no_gradient", {"learnable_sink": np.array([0.5, -0.5, 1.0, 0.0])}, "grad.learnable-sink"),
    ("broken_backward_window_forward_only", {"window": (1, 0), "query_offset": 2}, "grad.variants"),
])
def test_a_variant_backward_bug_is_filed_under_its_gradient_clause_with_a_repro(member, options, clause):
    pytest.importorskip("torch")
    from attention_conformance.conformance.judging.gradient_verdicts import GradientJudge
    from attention_conformance.conformance.test_variant_gradients import check_variant_gradients

    q, k, v, d_out, _ = grad_inputs(4)
    drawn_for = {"grad.softcap": "grad.softcap", "grad.learnable-sink": "grad.learnable-sink"}.get(clause,
                                                                                                  "grad.variants")
    case = Case("sdpa", {"q": q, "k": k, "v": v, "d_out": d_out, **options}, (drawn_for,), f"case for {clause}")
    impl = load_implementation(f"zoo.{member}")
    with pytest.raises(ConformanceFailure) as raised:
        check_variant_gradients(impl, "cpu", "float32", case)
    assert raised.value.clause == clause
    snippet = GradientJudge(impl, "float32", "cpu")._snippet(case, case.rounded("float32"))
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "max abs error" in result.stdout
    # The correct member passes the same case.
    check_variant_gradients(load_implementation("zoo.correct_torch_variant_backward"), "cpu", "float32", case)


def test_a_saturated_leading_key_under_softcap_is_no_false_alarm():
    """A row whose leading key saturates tanh (t / c = 19) while another key keeps a weight of 1e-42: the exact dS of
    the leading key, P (1 - P) (dP_lead - dP_other), is about 1e-41, which the float64 oracle's P (dP - r) cancels to
    0, as its G = 1 - y^2 (exact 1.3e-16) to 0, while XLA's tanh, 7 u below 1 there, gives G = 1.6e-15. jax_numpy's dq
    was 109x an allowance built on those zeros (a thorough-profile draw, t / c just under 20); the bound
    P (1 - P) * spread of dP fills the cancellation. The softcap backward without its derivative still fails."""
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    from attention_conformance.conformance.test_variant_gradients import check_variant_gradients

    # dq's second feature reads the leading key alone (k = (t, 0) and (t, 1), q = (1, 0)): dq_1 = dT of that key.
    inputs = {"q": np.array([1.0, 0.0]).reshape(1, 1, 1, 2),
              "k": np.array([[-251.17010975, 0.0], [954.50405786, 1.0]]).reshape(1, 1, 2, 2),
              "v": np.array([2.09641395, 5.1634552]).reshape(1, 1, 2, 1), "d_out": np.ones((1, 1, 1, 1)),
              "scale": 1.0, "softcap": 954.50405786 / 19.0}
    case = Case("sdpa", inputs, ("grad.softcap",), "saturated leading key")
    check_variant_gradients(load_implementation("builtin:jax_numpy"), "cpu", "float64", case)
    check_variant_gradients(load_implementation("builtin:torch_math"), "cpu", "float64", case)
    with pytest.raises(ConformanceFailure):
        check_variant_gradients(load_implementation("zoo.broken_backward_softcap_no_derivative"), "cpu", "float64",
                                case)


def test_a_saturated_softcap_keeps_its_slope_and_its_allowance():
    """Past |t / c| = 19, 1 - tanh^2(t / c) is 0 in float64 while sech^2 is a tiny positive number: a correct JAX
    custom_vjp (written independently of the suite, 2026-11-27) got dq 1e-30 on such a one-key row, where the
    allowance built on the rounded slope was 1e-307 (a false alarm of the thorough profile). The slope is sech^2 now,
    and the allowance covers it."""
    from attention_conformance.conformance.judging.gradients import backward_allowed
    from attention_conformance.conformance.reference import backward as oracle_backward

    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 1, 2, 80)), rng.standard_normal((1, 1, 1, 80))
    v, d_out = rng.standard_normal((1, 1, 1, 64)), rng.standard_normal((1, 1, 2, 64))
    t = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(80)
    cap = 0.05 * np.abs(t).max()  # row 0 at |t / c| = 20
    slope = oracle_backward.attention_parts(q, k, v, d_out, softcap=cap)["softcap_slope"]
    assert np.allclose(slope, 1.0 / np.cosh(t / cap) ** 2, rtol=1e-13, atol=0) and np.all(slope > 0)
    allowed = backward_allowed(q, k, v, d_out, None, False, None, "float64", softcap=cap)
    assert allowed["dq"][0, 0, 0].min() > 1e-40  # an implementation's rounding there is ~1e-16 * 1e-17


def test_a_weight_underflowed_to_zero_keeps_its_bound_under_a_large_float_mask():
    """A bfloat16 row whose scores (2000 apart) all carry a float mask of -1e9: the sum rounds them alike (spacing 4e6),
    so torch's math path weighs keys whose exact weight is 0 equally. Its dq was off by 0.85 where a bound over the
    keys with P > 0 allowed 0.55 (a false alarm of the thorough profile); every finite score counts."""
    import ml_dtypes

    from attention_conformance.conformance.judging.gradients import gradients

    bf16 = ml_dtypes.bfloat16
    q = np.array([[[[11.0625, 26.25, 10.5625, -41.75, 29.0, 14.3125], [-17.125, 18.625, 11.6875, 9.4375, 0.91015625,
                                                                         17.5]],
                   [[-23.625, -5.21875, -15.4375, 19.125, 1.2734375, -9.375], [-25.0, -8.25, 0.259765625, -8.8125,
                                                                                41.5, 32.25]],
                   [[-87.0, -60.5, -5.59375, -13.5, 6.84375, 6.96875], [68.0, -35.5, -12.0625, 65.5, 20.75, 21.25]],
                   [[-16.5, -52.75, 5.34375, 3.484375, -39.25, -21.875], [-2.3125, -30.25, -3.140625, 3.0625,
                                                                            1.140625, -16.25]]]]).astype(bf16)
    k = np.array([[[[19.0, 28.5, 10.25, -26.125, 23.375, -16.0], [28.125, -34.25, 29.25, -0.640625, -40.0, -10.0625]],
                   [[1.734375, 8.75, -31.375, -35.5, 6.375, -14.9375], [7.53125, 24.25, -52.75, 8.125, 39.25,
                                                                        -9.5]]]]).astype(bf16)
    v = np.array([[[[-0.8125], [0.75390625]], [[0.25390625], [0.89453125]]]]).astype(bf16)
    mask = np.full((1, 1, 2, 2), -998244352.0).astype(bf16)
    d_out = np.array([[[[0.10302734375], [-0.98046875]], [[-0.81640625], [-1.03125]], [[-0.57421875], [1.96875]],
                       [[0.392578125], [-0.0023040771484375]]]]).astype(bf16)
    got = gradients(load_implementation("builtin:torch_math"), {"q": q, "k": k, "v": v, "mask": mask}, d_out,
                    device="cpu")
    f64 = [x.astype(np.float64) for x in (q, k, v, d_out, mask)]
    want = oracle_backward.sdpa_backward(f64[0], f64[1], f64[2], f64[3], f64[4])
    allowed = backward_allowed(f64[0], f64[1], f64[2], f64[3], f64[4], False, None, "bfloat16")
    assert np.max(np.abs(got["dq"] - want["dq"])) > 0.5  # the weights did move: the bound is what is tested
    for name in ("dq", "dk", "dv", "dmask"):
        assert np.all(np.abs(got[name] - want[name]) <= allowed[name]), name

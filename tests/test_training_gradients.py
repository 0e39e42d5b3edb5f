"""Gradients where training takes them: packed batches (grad.varlen), multi-head attention with and without the
variant keywords (grad.mha, grad.mha-variants), and the gradients of cases whose rows without a key are declared NaN.

What is checked here: the analytic backward of a packed batch and of multi-head attention agrees with torch's
float64 autograd; the backward tolerance without input errors is exactly what it was, and input errors only add; a
packed backward leaking across sequences, a gradient reaching a key past seqused_k however small, a multi-head
backward forgetting the window and parameters the graph does not reach are each filed under their clause with a
repro that runs, and the correct members pass the same cases; a case with a row declared NaN keeps every gradient
that row cannot reach judged, so that a wrong gradient elsewhere is caught."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.reference import backward as oracle_backward
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.registry import from_object, load_implementation

pytestmark = [pytest.mark.selfcheck, pytest.mark.usefixtures("kept_records")]
ROOT = Path(__file__).resolve().parent.parent
torch = pytest.importorskip("torch")


# ----------------------------------------------------------------- packed batches
def varlen_case(clause: str = "grad.varlen", **extra) -> Case:
    """Four sequences: 3 queries against 4 of 5 packed keys, 2 against 4 keys, none against 2 keys, 3 against none
    used (seqused_k 0 of 2 packed rows); two kv heads of two query heads each."""
    rng = np.random.default_rng(0)
    hq, hkv, d = 4, 2, 3
    inputs = {"q": rng.standard_normal((8, hq, d)), "k": rng.standard_normal((13, hkv, d)),
              "v": rng.standard_normal((13, hkv, 2)), "cu_seqlens_q": np.array([0, 3, 5, 5, 8], np.int32),
              "cu_seqlens_k": np.array([0, 5, 9, 11, 13], np.int32), "max_seqlen_q": 3, "max_seqlen_k": 5,
              "seqused_k": np.array([4, 4, 2, 0], np.int32), "is_causal": True, **extra}
    inputs["k"][[4, 11, 12]] *= 30.0  # keys past seqused_k: garbage
    d_out = rng.standard_normal((8, hq, 2))
    d_out[5:] = 0.0  # the last sequence's rows have no key: dO 0 (varlen_gradient_cases)
    inputs["d_out"] = d_out
    return Case("sdpa_varlen", inputs, (clause,), f"packed case for {clause}")


VARLEN_VARIANTS = [{}, {"window": (1, None), "softcap": 1.5, "alibi_slopes": np.array([[0.5, 0.2, 0.1, 0.05]] * 4),
                        "learnable_sink": np.array([0.3, -1.0, 2.0, 0.0])}]


@pytest.mark.parametrize("variants", VARLEN_VARIANTS, ids=lambda v: "+".join(v) or "plain")
def test_the_packed_analytic_backward_agrees_with_torch_float64_autograd(variants):
    """backward.varlen_backward against torch autograd of torch_math's sdpa run sequence by sequence (float64)."""
    from attention_conformance.implementations.builtin.torch_backend import TorchMath

    a = varlen_case(**variants).inputs
    leaves = {n: torch.tensor(a[n], requires_grad=True) for n in ("q", "k", "v")}
    sink = None if "learnable_sink" not in a else torch.tensor(a["learnable_sink"], requires_grad=True)
    pieces = []
    spans = oracle.varlen_spans(a["cu_seqlens_q"], a["cu_seqlens_k"], a["seqused_k"])
    for b, (qs, qe, ks, ke) in enumerate(spans):
        lq, lk = qe - qs, ke - ks
        if lq and not lk:
            pieces.append(torch.zeros((lq, 4, 2), dtype=torch.float64))
        elif lq:
            heads = [leaves[n][s:e].transpose(0, 1)[None] for n, s, e in (("q", qs, qe), ("k", ks, ke), ("v", ks, ke))]
            keywords = {n: torch.tensor(x[b]) if n == "alibi_slopes" else x for n, x in variants.items()
                        if n != "learnable_sink"}
            out = TorchMath.sdpa(*heads, None, True, None, query_offset=lk - lq, learnable_sink=sink, **keywords)
            pieces.append(out[0].transpose(0, 1))
    torch.cat(pieces).backward(torch.tensor(a["d_out"]))
    want = oracle_backward.varlen_backward(a, a["d_out"])
    got = {"dq": leaves["q"].grad, "dk": leaves["k"].grad, "dv": leaves["v"].grad}
    if sink is not None:
        got["dsink"] = sink.grad
    assert set(got) == set(want)
    for name in want:
        assert np.allclose(got[name].numpy(), want[name], rtol=0, atol=1e-13), name
    assert not np.any(want["dk"][[4, 11, 12]]) and not np.any(want["dv"][[4, 11, 12]])  # past seqused_k: exactly 0
    assert not np.any(want["dk"][9:11]) and not np.any(want["dv"][9:11])  # the sequence without queries: none


def composed(member: str, case: Case, dtype: str = "float32"):
    from attention_conformance.conformance.judging.composed_gradients import ComposedGradientJudge, judge_composed

    impl = member if not isinstance(member, str) else load_implementation(member)
    judge = ComposedGradientJudge(impl, dtype, "cpu")
    judge_composed(judge, case, case.rounded(dtype))
    return judge


def repro_runs(judge, case: Case, dtype: str = "float32") -> str:
    snippet = judge._snippet(case, case.rounded(dtype))
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "max abs error" in result.stdout
    return result.stdout


@pytest.mark.parametrize("variants", VARLEN_VARIANTS, ids=lambda v: "+".join(v) or "plain")
def test_a_packed_backward_leaking_across_sequences_is_filed_under_grad_varlen_with_a_repro(variants):
    case = varlen_case(**variants)
    with pytest.raises(ConformanceFailure) as raised:
        composed("zoo.broken_backward_varlen_leaks_across_sequences", case)
    assert raised.value.clause == "grad.varlen" and "sequence" in str(raised.value)
    judge = composed("zoo.correct_torch_varlen_backward", case)  # the correct member passes the same case
    repro_runs(judge, case)
    composed("builtin:jax_numpy", case)


class TinyGradient(torch.autograd.Function):
    """The identity whose backward adds 1e-30 to every element of the gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad + 1e-30


class GradientPastSequsedK:
    """The correct packed member with 1e-30 added to dk everywhere, the keys past seqused_k too (its forward is
    right)."""

    ARRAY = "torch"
    DTYPES = ("float64",)

    @staticmethod
    def sdpa_varlen(q, k, v, *args, **kwargs):
        from zoo import correct_torch_varlen_backward as base

        return base.sdpa_varlen(q, TinyGradient.apply(k), v, *args, **kwargs)


def test_a_gradient_past_seqused_k_however_small_fails():
    impl = from_object(GradientPastSequsedK, "past_seqused", "tests.test_training_gradients:GradientPastSequsedK")
    with pytest.raises(ConformanceFailure) as raised:
        composed(impl, varlen_case(), "float64")
    assert raised.value.clause == "grad.varlen" and "past seqused_k" in str(raised.value)


def test_the_gradient_tolerance_without_input_errors_is_unchanged_and_input_errors_only_add():
    from attention_conformance.conformance.judging.gradients import backward_allowed

    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 2, 4, 3)), rng.standard_normal((2, 2, 5, 3)), rng.standard_normal((2, 2, 5, 3))
    d_out = rng.standard_normal((2, 2, 4, 3))
    plain = backward_allowed(q, k, v, d_out, None, True, None, "float32", learnable_sink=np.array([0.1, -0.4]))
    zero = backward_allowed(q, k, v, d_out, None, True, None, "float32", learnable_sink=np.array([0.1, -0.4]),
                            input_errors={"q": 0.0, "k": 0.0, "v": 0.0, "d_out": 0.0})
    assert all(np.array_equal(plain[n], zero[n]) for n in plain)
    some = backward_allowed(q, k, v, d_out, None, True, None, "float32", learnable_sink=np.array([0.1, -0.4]),
                            input_errors={"q": 1e-6, "k": 1e-6, "v": 1e-6, "d_out": 1e-6})
    assert all((some[n] >= plain[n]).all() and (some[n] > plain[n]).any() for n in plain)


# ----------------------------------------------------------------- multi-head attention
def mha_case(clause: str = "grad.mha", **extra) -> Case:
    rng = np.random.default_rng(5)
    e, heads, width = 4, 2, 3
    params = {"w_q": rng.standard_normal((e, heads * width)), "w_k": rng.standard_normal((5, heads * width)),
              "w_v": rng.standard_normal((5, heads * width)), "w_o": rng.standard_normal((heads * width, e)),
              "b_q": rng.standard_normal(heads * width), "b_o": rng.standard_normal(e)}
    inputs = {"query": rng.standard_normal((2, 5, e)), "key": rng.standard_normal((2, 6, 5)),
              "value": rng.standard_normal((2, 6, 5)), "params": params, "num_heads": heads, **extra}
    inputs["d_out"] = rng.standard_normal((2, 5, e))
    return Case("multi_head_attention", inputs, (clause,), f"multi-head case for {clause}")


def test_the_multi_head_analytic_backward_agrees_with_torch_float64_autograd():
    from attention_conformance.implementations.builtin.torch_backend import TorchMath

    variants = {"window": (1, 2), "softcap": 2.0, "alibi_slopes": np.array([0.3, 0.1]), "query_offset": 1,
                "learnable_sink": np.array([0.2, -1.0]), "key_lengths": np.array([4, 6], np.int32)}
    a = mha_case(**variants).inputs
    mask = np.random.default_rng(6).standard_normal((2, 1, 5, 6))
    leaves = {n: torch.tensor(a[n], requires_grad=True) for n in ("query", "key", "value")}
    params = {n: torch.tensor(x, requires_grad=True) for n, x in a["params"].items()}
    keywords = {n: torch.tensor(x, requires_grad=n == "learnable_sink") if isinstance(x, np.ndarray) else x
                for n, x in variants.items()}
    out = TorchMath.multi_head_attention(leaves["query"], leaves["key"], leaves["value"], params, 2,
                                         torch.tensor(mask), True, **keywords)
    out.backward(torch.tensor(a["d_out"]))
    want = oracle_backward.mha_backward(a["query"], a["key"], a["value"], a["params"], 2, a["d_out"], mask, True,
                                        **variants)
    got = {"d" + n: t.grad for n, t in leaves.items()} | {"d" + n: t.grad for n, t in params.items()}
    got["dsink"] = keywords["learnable_sink"].grad
    assert set(got) == set(want)
    for name in want:
        assert np.allclose(got[name].numpy(), want[name], rtol=0, atol=1e-12), name


def test_a_multi_head_backward_forgetting_the_window_is_filed_under_grad_mha_variants_with_a_repro():
    case = mha_case("grad.mha-variants", window=(0, 1), alibi_slopes=np.array([0.5, 0.1]), is_causal=False)
    from attention_conformance.conformance.judging.composed_gradients import ComposedGradientJudge, judge_composed
    from attention_conformance.conformance.test_mha_gradients import mha_variant_blame

    judge = ComposedGradientJudge(load_implementation("zoo.broken_backward_mha_window_forward_only"), "float32", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge_composed(judge, case, case.rounded("float32"), blame=mha_variant_blame)
    assert raised.value.clause == "grad.mha-variants" and "without window agrees" in str(raised.value)
    repro_runs(judge, case)
    composed("zoo.correct_torch_mha_variant_backward", case)
    composed("builtin:torch_math", case)
    composed("builtin:jax_numpy", case)


class ParametersCopiedUnderNoGrad:
    """nn.MultiheadAttention fed the contract's parameters by copy_ under no_grad (what torch_nn_mha did): the
    forward is right, no gradient reaches the parameters."""

    ARRAY = "torch"
    DTYPES = ("float64", "float32")

    @staticmethod
    def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
        from zoo import correct_torch_mha_variant_backward as base

        with torch.no_grad():
            detached = {name: p.detach().clone() for name, p in params.items()}
        return base.multi_head_attention(query, key, value, detached, num_heads, mask, is_causal)


def test_parameters_the_graph_does_not_reach_fail_grad_mha():
    impl = from_object(ParametersCopiedUnderNoGrad, "copied", "tests.test_training_gradients:ParametersCopiedUnderNoGrad")
    with pytest.raises(ConformanceFailure) as raised:
        composed(impl, mha_case())
    assert raised.value.clause == "grad.mha" and "no gradient reached params" in str(raised.value)


# ----------------------------------------------------------------- rows declared NaN
class NanRows:
    """torch.softmax over rows of -inf: NaN rows, declared; the backward autograd's (NaN * 0 reaches dk, dv of the
    row's batch entry and head, and its own dq)."""

    ARRAY = "torch"
    DTYPES = ("float64", "float32")
    FULLY_MASKED_ROWS = "nan"
    SCALE_DQ = SCALE_DV = 1.0

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        q, v = Scaled.apply(q, cls.SCALE_DQ), Scaled.apply(v, cls.SCALE_DV)
        s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        return torch.softmax(s, dim=-1) @ v


class Scaled(torch.autograd.Function):
    """The identity whose backward multiplies the gradient by ``factor`` (a wrong gradient of one input)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class NanRowsWrongDv(NanRows):
    SCALE_DV = 1.5


class NanRowsWrongDq(NanRows):
    SCALE_DQ = 1.5


def nan_case(mask: np.ndarray) -> Case:
    rng = np.random.default_rng(9)
    q, k, v = rng.standard_normal((2, 2, 3, 2)), rng.standard_normal((2, 2, 4, 2)), rng.standard_normal((2, 2, 4, 2))
    keyless = oracle.fully_masked_rows(q, k, mask)[..., None]
    d_out = np.where(keyless, 0.0, rng.standard_normal((2, 2, 3, 2)))
    return Case("sdpa", {"q": q, "k": k, "v": v, "mask": mask, "d_out": d_out}, ("grad.sdpa-q",), "rows declared NaN")


def judged_nan(cls, case: Case):
    from attention_conformance.conformance.judging.gradient_verdicts import GradientJudge, judge_gradients

    impl = from_object(cls, cls.__name__, f"tests.test_training_gradients:{cls.__name__}")
    judge_gradients(GradientJudge(impl, "float64", "cpu"), case, case.rounded("float64"))


def test_a_case_with_rows_declared_nan_keeps_its_other_gradients_judged():
    """Batch entry 0 has no key at all (key padding): its output rows are NaN as declared, and so are dq of those
    rows and dk, dv of every key of that entry; batch entry 1 is judged as any case, and so is dq of every row with a
    key, even beside a NaN row of the same entry."""
    from attention_conformance.conformance.judging import records

    padding = np.ones((2, 1, 1, 4), dtype=bool)
    padding[0] = False
    case = nan_case(padding)
    judged_nan(NanRows, case)  # NaN where a NaN row reaches, the rest right: passes
    assert {r.clause for r in records.RECORDS[-4:]} >= {"grad.sdpa-q", "grad.sdpa-k", "grad.sdpa-v"}
    with pytest.raises(ConformanceFailure) as raised:
        judged_nan(NanRowsWrongDv, case)  # dv of batch entry 1 wrong
    assert raised.value.clause == "grad.sdpa-v"
    one_row = np.ones((2, 1, 3, 4), dtype=bool)
    one_row[0, 0, 1] = False  # only row 1 of batch entry 0 has no key
    judged_nan(NanRows, nan_case(one_row))
    with pytest.raises(ConformanceFailure) as raised:
        judged_nan(NanRowsWrongDq, nan_case(one_row))  # dq of the rows with a key wrong
    assert raised.value.clause == "grad.sdpa-q"


def test_the_unjudged_elements_of_a_nan_row_are_the_ones_it_reaches():
    from attention_conformance.conformance.judging.gradient_verdicts import GradientJudge, nan_row_unjudged

    one_row = np.ones((2, 1, 3, 4), dtype=bool)
    one_row[0, 0, 1] = False
    case = nan_case(one_row)
    inputs = case.rounded("float64")
    impl = from_object(NanRows, "NanRows", "tests.test_training_gradients:NanRows")
    want = oracle_backward.sdpa_backward(inputs["q"], inputs["k"], inputs["v"], inputs["d_out"], one_row)
    unjudged = nan_row_unjudged(GradientJudge(impl, "float64", "cpu"), case, inputs, want)
    assert unjudged["dq"][0, :, 1].all() and not unjudged["dq"][0, :, [0, 2]].any() and not unjudged["dq"][1].any()
    assert unjudged["dk"][0].all() and not unjudged["dk"][1].any() and unjudged["dv"][0].all()


def test_one_tensor_passed_as_query_key_and_value_takes_the_sum_of_their_gradients():
    """Self-attention passes x as query, key and value (a case whose three are equal): the suite differentiates one
    tensor, as training does, and its gradient is the sum of the three uses'. A layer that reads x once (the
    document's SelfAttentionEncoder) passes; the analytic sum is what torch_math's three separate uses give."""
    from attention_conformance.conformance.judging.composed_gradients import analytic_gradients, shared_inputs

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4))
    params = {f"w_{n}": rng.standard_normal((4, 4)) for n in "qkvo"}
    case = Case("multi_head_attention", {"query": x, "key": x, "value": x, "params": params, "num_heads": 2,
                                         "d_out": rng.standard_normal((2, 3, 4))}, ("grad.mha",), "self-attention")
    inputs = case.rounded("float64")
    assert shared_inputs("multi_head_attention", inputs) == {"key": "query", "value": "query"}
    want = analytic_gradients("multi_head_attention", inputs)
    full = oracle_backward.mha_backward(x, x, x, params, 2, inputs["d_out"])
    assert "dkey" not in want and np.allclose(want["dquery"], full["dquery"] + full["dkey"] + full["dvalue"])
    composed("zoo.correct_docs_000_self_attention_encoder", case, "float64")
    composed("builtin:torch_math", case, "float64")

"""The ready-made deviations (implementations/deviations.py), each against a NumPy stand-in that follows its
convention: the convention's cases are reported as deviations (xfail with the reason: not a failure, not a pass);
an implementation without the convention that declares the entry still passes where it is right; a different
defect beside the declared one still fails.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.records import RECORDS
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.specdata import clauses
from attention_conformance.implementations import deviations
from attention_conformance.implementations.registry import load_implementation

from .attention_parts import attention_parts
from .battery import run_battery

pytestmark = pytest.mark.selfcheck
SPEC = "tests.test_deviation_predicates"
LARGE_NEGATIVE = -0.7 * np.finfo(np.float64).max  # JAX's and Keras' fill


# ------------------------------------------------------------------ stand-ins
def _parts(*args, **kwargs):
    """float64 scores (scaled, float mask added), the keys the boolean removals keep, v per query head."""
    return attention_parts(*args, **kwargs)[:3]


def _softmax(logits: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # a row of -inf (or NaN) stays NaN: 0/0
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


class LargeNegativeFill:
    """jax.nn.dot_product_attention / keras.ops.dot_product_attention: the float mask added, every removal (boolean
    mask, is_causal, window, key lengths) one boolean mask filled with -0.7 * finfo.max."""

    FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS
    KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note="stand-in"),)
    CAUSAL_SHIFT = 0

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, window=None, query_offset=0,
             query_lengths=None, key_lengths=None):
        s, keep, v64 = _parts(q, k, v, mask, is_causal, scale, window, query_offset, key_lengths, cls.CAUSAL_SHIFT)
        return (_softmax(np.where(keep, s, LARGE_NEGATIVE)) @ v64).astype(np.asarray(q).dtype)


class LargeNegativeFillUndeclared(LargeNegativeFill):
    KNOWN_DEVIATIONS = ()


class LargeNegativeFillCausalPlusOne(LargeNegativeFill):
    """The convention and, beside it, a causal band one key too wide: a different defect."""

    CAUSAL_SHIFT = 1


class Float64InFloat32:
    """float64 inputs computed at float32 precision (the reference on float32 copies, cast back)."""

    KNOWN_DEVIATIONS = (deviations.float64_computed_in_float32(note="stand-in"),)
    IGNORE_SCALE = False

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        q32, k32, v32 = (np.asarray(a).astype(np.float32) for a in (q, k, v))
        mask32 = mask if mask is None or np.asarray(mask).dtype == np.bool_ else np.asarray(mask).astype(np.float32)
        s, keep, v64 = _parts(q32, k32, v32, mask32, is_causal, None if cls.IGNORE_SCALE else scale)
        s = np.where(keep, s, -np.inf).astype(np.float32)
        weights = _softmax(s)
        weights = np.where(np.isnan(weights), 0.0, weights).astype(np.float32)
        return (weights @ v64.astype(np.float32)).astype(np.asarray(q).dtype)


class Float64InFloat32Undeclared(Float64InFloat32):
    KNOWN_DEVIATIONS = ()


class Float64InFloat32IgnoresScale(Float64InFloat32):
    IGNORE_SCALE = True


class AdditiveFinfoMin:
    """HF transformers' eager attention: the removals as an additive finfo(dtype).min, added to the scores in the
    input dtype (float16 overflows to -inf below about -16), softmax in float32, the weights back in the dtype."""

    DTYPES = ("float16", "float32")
    FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS
    KNOWN_DEVIATIONS = (deviations.masked_fill_overflow_16bit(note="stand-in"),
                        deviations.large_finite_negative_mask_fill(note="stand-in"))

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        dtype = np.asarray(q).dtype
        s, keep, v64 = _parts(q, k, v, mask, is_causal, scale)
        with np.errstate(over="ignore"):
            logits = s.astype(dtype) + np.where(keep, 0.0, np.finfo(dtype).min).astype(dtype)
        weights = _softmax(logits.astype(np.float32)).astype(dtype)
        return (weights.astype(np.float32) @ v64.astype(np.float32)).astype(dtype)


class AdditiveFinfoMinUndeclared(AdditiveFinfoMin):
    KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note="stand-in"),)


class ScaleAfterMasking:
    """Masks with -inf, then scales: -inf * 0 is NaN, -inf times a negative scale +inf."""

    KNOWN_DEVIATIONS = (deviations.scale_after_masking(note="stand-in"),)
    DEFAULT_SCALE_BUG = False

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        additive = mask is not None and np.asarray(mask).dtype != np.bool_
        s, keep, v64 = _parts(q, k, v, None if additive else mask, is_causal, 1.0)
        if scale is None:
            scale = 1.0 / (q.shape[-1] if cls.DEFAULT_SCALE_BUG else math.sqrt(q.shape[-1]))
        with np.errstate(invalid="ignore"):
            logits = np.where(keep, s, -np.inf) * float(scale)
            logits = logits + np.asarray(mask).astype(np.float64) if additive else logits
        weights = _softmax(logits)
        weights = np.where(np.isneginf(logits).all(axis=-1, keepdims=True), 0.0, weights)
        return (weights @ v64).astype(np.asarray(q).dtype)


class ScaleAfterMaskingUndeclared(ScaleAfterMasking):
    KNOWN_DEVIATIONS = ()


class ScaleAfterMaskingDefaultScaleBug(ScaleAfterMasking):
    DEFAULT_SCALE_BUG = True


class CorrectDeclaringAll:
    """The reference (-inf masking, zeros for a row without keys) declaring every ready-made deviation."""

    DTYPES = ("float16", "float32", "float64")
    KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(), deviations.float64_computed_in_float32(),
                        deviations.masked_fill_overflow_16bit(), deviations.scale_after_masking())

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        s, keep, v64 = _parts(q, k, v, mask, is_causal, scale)
        weights = _softmax(np.where(keep, s, -np.inf))
        return (np.where(np.isnan(weights), 0.0, weights) @ v64).astype(np.asarray(q).dtype)


# ------------------------------------------------------------------ cases where a convention shows
def _case(lq=4, lk=4, **options) -> Case:
    rng = np.random.default_rng(3)
    inputs = {"q": rng.standard_normal((1, 2, lq, 8)), "k": rng.standard_normal((1, 2, lk, 8)),
              "v": rng.standard_normal((1, 2, lk, 3)), **options}
    return Case("sdpa", inputs, ("mask.fully-masked-row",), "crafted", mask_kind="crafted")


def _float_mask_on_the_causal_keys() -> Case:
    """Row 2's float mask is -inf on keys 0..2, the keys the causal band leaves it: it should follow the "float"
    policy; a large finite fill on key 3 makes it attend that future key."""
    bias = np.zeros((4, 4))
    bias[2, :3] = -np.inf
    return _case(mask=bias, is_causal=True)


def _bool_row_with_overflowing_scores() -> Case:
    """Row 1 attends no key, and every score of it is far below -16: finfo(float16).min + score overflows."""
    case = _case(mask=np.array([[True] * 4, [False] * 4, [True] * 4, [True] * 4]))
    case.inputs["q"][:, :, 1] = -8.0 * np.abs(case.inputs["q"][:, :, 1])
    case.inputs["k"][...] = np.abs(case.inputs["k"]) + 1.0
    return case


CONVENTION_CASES = {
    "LargeNegativeFill": ("float32", _float_mask_on_the_causal_keys, {}),
    "Float64InFloat32": ("float64", lambda: _case(mask=np.zeros((4, 4)), scale=0.9), {}),
    "AdditiveFinfoMin": ("float16", _bool_row_with_overflowing_scores, {}),
    "ScaleAfterMasking": ("float32", lambda: _case(is_causal=True, scale=0.0), {}),
}


def _verdict(spec: str, dtype: str, case: Case) -> str:
    """"passed", "deviation: <reason>" or "failed: <clause>" of one case, from what Judge.check raises."""
    try:
        Judge(load_implementation(spec), dtype, "cpu").check(case)
    except ConformanceFailure as failure:
        return f"failed: {failure.clause}"
    except pytest.xfail.Exception as declared:
        return f"deviation: {declared}"
    return "passed"


@pytest.mark.parametrize("member", sorted(CONVENTION_CASES))
def test_the_convention_is_reported_as_a_declared_deviation(member, kept_records):
    dtype, make, _ = CONVENTION_CASES[member]
    kept = len(RECORDS)
    verdict = _verdict(f"{SPEC}:{member}", dtype, make())
    assert verdict.startswith("deviation: "), verdict
    assert "(stand-in)" in verdict  # the entry's reason, with the note
    assert [r.status for r in RECORDS[kept:]] == ["deviation"]


@pytest.mark.parametrize("member", sorted(CONVENTION_CASES))
def test_without_the_declaration_the_same_case_fails(member, kept_records):
    dtype, make, _ = CONVENTION_CASES[member]
    verdict = _verdict(f"{SPEC}:{member}Undeclared", dtype, make())
    assert verdict.startswith("failed: "), verdict


@pytest.mark.parametrize("member", sorted(CONVENTION_CASES))
def test_an_implementation_without_the_convention_passes_the_same_case(member, kept_records):
    dtype, make, _ = CONVENTION_CASES[member]
    assert _verdict(f"{SPEC}:CorrectDeclaringAll", dtype, make()) == "passed"


@pytest.mark.parametrize("member, dtype, case, clause", [
    ("LargeNegativeFillCausalPlusOne", "float32", lambda: _case(is_causal=True), "causal.top-left"),
    ("Float64InFloat32IgnoresScale", "float32", lambda: _case(scale=0.9), "sdpa.scale-explicit"),
    ("ScaleAfterMaskingDefaultScaleBug", "float32", lambda: _case(), "sdpa.scale-default"),
])
def test_a_different_defect_beside_the_declared_one_still_fails(member, dtype, case, clause, kept_records):
    made = case()
    made.clauses = (clause,)
    assert _verdict(f"{SPEC}:{member}", dtype, made) == f"failed: {clause}"


@pytest.mark.parametrize("member, dtypes, declared", [
    ("LargeNegativeFill", ("float32",), None),
    ("Float64InFloat32", ("float64", "float32"), "computed at float32 precision"),  # every float64 case
    ("AdditiveFinfoMin", ("float16", "float32"), None),
    ("ScaleAfterMasking", ("float32",), "before the scale is applied"),  # the scale-0 corners
    ("CorrectDeclaringAll", ("float16", "float32", "float64"), None),
])
def test_the_whole_suite_passes_a_stand_in_that_declares_its_convention(member, dtypes, declared):
    verdicts = run_battery(load_implementation(f"{SPEC}:{member}"), dtypes=dtypes, max_examples=4, brief=True)
    assert not verdicts.errors, verdicts.errors[:3]
    assert not verdicts.failures, verdicts.failures[:5]
    assert verdicts.passed > 0
    assert not [r for r in verdicts.records if r.status == "failed"]
    if declared:  # the run met the convention and reported it as the declared deviation
        assert [r for r in verdicts.records if r.status == "deviation" and declared in r.message]
    if member == "CorrectDeclaringAll":  # nothing of it is a deviation: every entry is narrower than "always"
        assert not verdicts.deviations and not [r for r in verdicts.records if r.status == "deviation"]


def test_float64_at_float32_precision_names_every_value_clause_and_no_structural_one():
    entry = deviations.float64_computed_in_float32()
    named = set(entry["clause"])
    spec = clauses()
    assert named <= set(spec)
    for must in ("sdpa.definition", "softmax.definition", "mha.projections", "grad.sdpa-q", "sdpa.window",
                 "dropout.p-zero", "mask.fully-masked-row"):
        assert must in named, must
    assert not named & deviations.STRUCTURAL_CLAUSES
    assert entry["when"]({"dtype": "float64", "op": "sdpa"}) and not entry["when"]({"dtype": "float32", "op": "sdpa"})
    only_softmax = deviations.float64_computed_in_float32(ops=("softmax",))
    assert "sdpa.definition" not in only_softmax["clause"] and not only_softmax["when"]({"dtype": "float64",
                                                                                           "op": "sdpa"})
    with pytest.raises(ValueError, match="'mha'"):
        deviations.float64_computed_in_float32(ops=("mha",))


@pytest.mark.parametrize("facts, expected", [
    # large_finite_negative_mask_fill: a float-attributed row beside a removal, nothing else.
    ({"mask_kind": "float", "fully_masked": True, "fully_masked_causes": ("float",), "is_causal": True}, True),
    ({"mask_kind": "float", "fully_masked": True, "fully_masked_causes": ("float",), "is_causal": False,
      "variants": ("key_lengths",)}, True),
    ({"mask_kind": "float", "fully_masked": True, "fully_masked_causes": ("float",), "is_causal": False,
      "variants": ()}, False),  # the bias alone: NaN, FULLY_MASKED_ROWS' "float"
    ({"mask_kind": "float", "fully_masked": True, "fully_masked_causes": ("window",), "is_causal": False,
      "variants": ("window",)}, False),  # a window row: the "window" policy
    ({"mask_kind": "bool", "fully_masked": True, "fully_masked_causes": ("bool",), "is_causal": True}, False),
    ({"mask_kind": "float", "fully_masked": False, "fully_masked_causes": (), "is_causal": True}, False),
])
def test_the_large_negative_predicate_is_as_narrow_as_the_convention(facts, expected):
    assert deviations.float_row_beside_a_removal(facts) is expected


def test_the_16bit_predicate_is_float16_with_a_removed_row_only():
    base = {"dtype": "float16", "fully_masked": True, "fully_masked_causes": ("bool",)}
    assert deviations.float16_row_masked_by_a_removal(base)
    assert not deviations.float16_row_masked_by_a_removal({**base, "dtype": "bfloat16"})
    assert not deviations.float16_row_masked_by_a_removal({**base, "fully_masked": False})
    assert not deviations.float16_row_masked_by_a_removal({**base, "fully_masked_causes": ("float",)})


def test_the_scale_predicate_is_a_nonpositive_explicit_scale_only():
    anywhere = deviations.scale_after_masking()["when"]
    causal_cpu = deviations.scale_after_masking(causal_only=True, devices=("cpu",))["when"]
    facts = {"scale": 0.0, "is_causal": True, "mask_kind": "none", "device": "cpu", "dtype": "float32"}
    assert anywhere(facts) and causal_cpu(facts)
    assert not anywhere({**facts, "scale": None}) and not anywhere({**facts, "scale": 0.5})
    assert anywhere({**facts, "scale": -0.5, "is_causal": False}) and not causal_cpu({**facts, "is_causal": False})
    assert not causal_cpu({**facts, "device": "cuda"}) and not causal_cpu({**facts, "mask_kind": "bool"})


def test_the_jax_built_in_uses_the_ready_made_entry():
    from attention_conformance.implementations.builtin.jax_backend import JaxDotProductAttention

    assert JaxDotProductAttention.FULLY_MASKED_ROWS == deviations.LARGE_FINITE_NEGATIVE_ROWS
    assert [d["when"] for d in JaxDotProductAttention.KNOWN_DEVIATIONS] == [deviations.float_row_beside_a_removal]


def test_the_cudnn_backward_deviation_is_dq_of_masked_16bit_cuda_cases_only():
    """Declared from the first GPU run's two torch_sdpa_cudnn gradient failures (both with a mask), never wider."""
    from attention_conformance.implementations.builtin.cuda_deviations import CUDA_CUDNN_MASKED_BACKWARD_NAN
    from attention_conformance.implementations.builtin.torch_backend import TorchSDPA
    from attention_conformance.implementations.builtin.torch_cuda import TorchCuDNNAttention

    when = CUDA_CUDNN_MASKED_BACKWARD_NAN["when"]
    facts = {"device": "cuda", "dtype": "bfloat16", "mask_kind": "bool", "scale": None, "is_causal": True}
    assert when(facts) and when({**facts, "dtype": "float16", "mask_kind": "float"})
    assert not when({**facts, "mask_kind": "none"}) and not when({**facts, "dtype": "float32"})
    assert not when({**facts, "device": "cpu"})
    assert CUDA_CUDNN_MASKED_BACKWARD_NAN["clause"] == "grad.sdpa-q"
    assert CUDA_CUDNN_MASKED_BACKWARD_NAN in TorchCuDNNAttention.KNOWN_DEVIATIONS
    assert CUDA_CUDNN_MASKED_BACKWARD_NAN not in TorchSDPA.KNOWN_DEVIATIONS  # its default dispatch passed them
    load_implementation("builtin:torch_sdpa_cudnn")  # the declaration is well formed


def test_the_cudnn_finite_mask_fill_is_float16_score_range_with_a_mask_on_cuda_only():
    """Declared from the H100 run's one torch_sdpa_cudnn failure and benchmarks/score_range_probe.py, never wider."""
    from attention_conformance.implementations.builtin.cuda_deviations import CUDA_CUDNN_FINITE_MASK_FILL
    from attention_conformance.implementations.builtin.jax_backend import JaxCuDNNAttention
    from attention_conformance.implementations.builtin.torch_backend import TorchSDPA
    from attention_conformance.implementations.builtin.torch_cuda import TorchCuDNNAttention

    when = CUDA_CUDNN_FINITE_MASK_FILL["when"]
    facts = {"device": "cuda", "dtype": "float16", "mask_kind": "bool", "scale": None, "is_causal": True}
    assert when(facts) and when({**facts, "mask_kind": "float", "is_causal": False})
    assert not when({**facts, "mask_kind": "none"}) and not when({**facts, "dtype": "bfloat16"})
    assert not when({**facts, "device": "cpu"})
    assert CUDA_CUDNN_FINITE_MASK_FILL["clause"] == "sdpa.score-range"
    assert CUDA_CUDNN_FINITE_MASK_FILL in TorchCuDNNAttention.KNOWN_DEVIATIONS
    assert CUDA_CUDNN_FINITE_MASK_FILL in TorchSDPA.KNOWN_DEVIATIONS  # the probe: its dispatch picked cuDNN
    assert CUDA_CUDNN_FINITE_MASK_FILL not in JaxCuDNNAttention.KNOWN_DEVIATIONS  # right on the same inputs


def test_each_pinned_torch_kernel_declares_only_what_was_measured_of_it():
    """The default dispatch's entries describe cuDNN (its pick for 16 bits); a pinned kernel inherited them all until
    the H100 and H200 reports showed torch_sdpa_efficient with 0 deviations and torch_sdpa_flash with sdpa.finite only.
    An inherited entry would pass the efficient kernel's NaN for scale 0 or its wrong fully masked rows."""
    from attention_conformance.implementations.builtin.cuda_deviations import CUDA_NAN_NONPOSITIVE_SCALE
    from attention_conformance.implementations.builtin.torch_backend import TorchSDPA
    from attention_conformance.implementations.builtin.torch_cuda import (
        TorchCuDNNAttention,
        TorchFlashAttention,
        TorchMemoryEfficientAttention,
    )

    facts = {"device": "cuda", "dtype": "float16", "mask_kind": "bool", "scale": 0.0, "is_causal": False,
             "fully_masked": True, "Lk": 64}
    declared = lambda cls: [d for d in cls.KNOWN_DEVIATIONS if d["when"](facts)]  # noqa: E731
    assert declared(TorchMemoryEfficientAttention) == []
    assert declared(TorchFlashAttention) == [CUDA_NAN_NONPOSITIVE_SCALE]
    assert len(declared(TorchCuDNNAttention)) >= 3 and len(declared(TorchSDPA)) >= 3  # NaN scale, rows, mask fill
    for name in ("torch_sdpa_efficient", "torch_sdpa_flash"):
        load_implementation(f"builtin:{name}")  # the declarations are well formed

"""LAYOUT "blhd": sdpa's q, k, v and output as (B, L, H, D), handed over contiguous and read back in it; OUTPUT_LAYOUT:
the output's alone, where it differs (Hugging Face's attention functions take (B, H, L, D) and return (B, L, H, D)).

A stand-in that computes in (B, L, H, D) and declares it passes everything its (B, H, L, D) twin passes, forward,
gradients and dropout included; the same stand-in declaring the default fails, and the failure names
contract.layout; a repro hands it the layout it takes.
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.gradients import gradients
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.builtin.torch_backend import TorchSDPA
from attention_conformance.implementations.registry import ImplementationLoadError, from_object, load_implementation
from zoo import _reference as ref

from .battery import run_battery

pytestmark = pytest.mark.selfcheck
SPEC = "tests.test_layout"
ROOT = Path(__file__).resolve().parents[1]


def _bhld(*arrays):
    return [np.swapaxes(a, 1, 2) for a in arrays]


def _require_contiguous(*arrays) -> None:
    # What a kernel that reads raw pointers needs; the suite promises it (np.ascontiguousarray / .contiguous()).
    for array in arrays:
        if not (array.flags.c_contiguous if isinstance(array, np.ndarray) else array.is_contiguous()):
            raise ValueError("q, k and v must be contiguous")


class NumpyBLHD:
    """The reference computed on (B, L, H, D) inputs, declared."""

    LAYOUT = "blhd"

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        _require_contiguous(q, k, v)
        out = ref.sdpa(*_bhld(q, k, v), mask, is_causal, scale)
        return np.ascontiguousarray(np.swapaxes(out, 1, 2))


class NumpyBHLD:
    """Its twin in the default layout."""

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        _require_contiguous(q, k, v)
        return ref.sdpa(q, k, v, mask, is_causal, scale)


class NumpyBLHDUndeclared(NumpyBLHD):
    LAYOUT = "bhld"


class NumpyBLHDWrongOutput(NumpyBLHD):
    """Computes in (B, L, H, D) but returns (B, H, L, D)."""

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        return ref.sdpa(*_bhld(q, k, v), mask, is_causal, scale)


class NumpyBLHDWritesQ(NumpyBLHD):
    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        out = NumpyBLHD.sdpa(q, k, v, mask, is_causal, scale)
        q[0, 0, 0, 0] += 1.0
        return out


class TorchBLHD:
    """torch's SDPA behind (B, L, H, D), as FlashAttention's and JAX's APIs take it; differentiable, with dropout."""

    ARRAY = "torch"
    LAYOUT = "blhd"
    DTYPES = ("float32", "float64")
    KNOWN_DEVIATIONS = TorchSDPA.KNOWN_DEVIATIONS  # torch's CPU kernel at is_causal with a scale <= 0, either layout

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0):
        _require_contiguous(q, k, v)
        out = TorchSDPA.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, is_causal, scale,
                             dropout_p)
        return out.transpose(1, 2)


class TorchBHLD:
    ARRAY = "torch"
    DTYPES = ("float32", "float64")
    KNOWN_DEVIATIONS = TorchSDPA.KNOWN_DEVIATIONS

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0):
        _require_contiguous(q, k, v)
        return TorchSDPA.sdpa(q, k, v, mask, is_causal, scale, dropout_p)


class NumpyHFStyle:
    """(B, H, L, D) in, (B, L, H, D) out, as Hugging Face's attention functions return it; declared."""

    OUTPUT_LAYOUT = "blhd"

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        return np.ascontiguousarray(np.swapaxes(ref.sdpa(q, k, v, mask, is_causal, scale), 1, 2))


class NumpyHFStyleUndeclared(NumpyHFStyle):
    OUTPUT_LAYOUT = None


class TorchHFStyle:
    """torch's SDPA returning (B, L, H, D) from (B, H, L, D) inputs: differentiable, so d_out goes in that layout."""

    ARRAY = "torch"
    OUTPUT_LAYOUT = "blhd"
    DTYPES = ("float32", "float64")
    KNOWN_DEVIATIONS = TorchSDPA.KNOWN_DEVIATIONS

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        return TorchSDPA.sdpa(q, k, v, mask, is_causal, scale).transpose(1, 2)


def _sdpa_case(**options) -> Case:
    rng = np.random.default_rng(5)
    inputs = {"q": rng.standard_normal((2, 3, 5, 4)), "k": rng.standard_normal((2, 1, 7, 4)),
              "v": rng.standard_normal((2, 1, 7, 2)), **options}
    return Case("sdpa", inputs, ("sdpa.definition",), "B2 Hq3 Hkv1 Lq5 Lk7")


# ------------------------------------------------------------------ the suite on both layouts
@pytest.mark.parametrize("blhd, bhld, dtypes", [
    ("NumpyBLHD", "NumpyBHLD", ("float32", "float64")),
    ("TorchBLHD", "TorchBHLD", ("float32",)),
])
def test_a_declared_blhd_stand_in_passes_everything_its_bhld_twin_passes(blhd, bhld, dtypes):
    results = {}
    for member in (blhd, bhld):
        impl = load_implementation(f"{SPEC}:{member}")
        results[member] = run_battery(impl, dtypes=dtypes, max_examples=4, brief=True)
        assert not results[member].errors, results[member].errors[:3]
        assert not results[member].failures, (member, results[member].failures[:5])
    assert results[blhd].passed == results[bhld].passed > 0


def test_the_undeclared_layout_fails_under_contract_layout():
    impl = load_implementation(f"{SPEC}:NumpyBLHDUndeclared")
    verdicts = run_battery(impl, dtypes=("float32",), max_examples=4, brief=True,
                           stop_on=frozenset({"contract.layout"}))
    assert "contract.layout" in verdicts.clauses, verdicts.failures[:5]


def test_a_failure_in_the_wrong_layout_says_which_layout_passes(kept_records):
    judge = Judge(load_implementation(f"{SPEC}:NumpyBLHDUndeclared"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(_sdpa_case(is_causal=True))
    assert raised.value.clause == "contract.layout"
    assert "passes with q, k, v handed as (B, L, H, D) (LAYOUT 'blhd')" in str(raised.value)


def test_a_case_without_an_attending_row_is_not_probed_for_the_layout(kept_records):
    """key_lengths [0] leave no row a key: the exact output is 0 in either layout, so the other layout passes whatever
    the fault. A tiled kernel that masked key lengths in its last key block only (one block in the other layout's
    reading, of one kv head) passed there and was filed under contract.layout."""
    impl = load_implementation("zoo.broken_tiled_key_lengths_last_block_only")
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 1, 65, 64)) for _ in range(3))
    case = Case("sdpa", {"q": q, "k": k, "v": v, "key_lengths": np.array([0], np.int32)}, ("sdpa.varlen",),
                "B1 Hq1/Hkv1 Lq65 Lk65 key_lengths=[0]")
    judge = Judge(impl, "float32", "cpu")
    _, inputs = judge.run(case)
    with pytest.raises(ConformanceFailure) as raised:  # as test_key_lengths_are_a_key_padding_mask files it
        judge.fail("sdpa.varlen", case, inputs, "key lengths against the same keys masked: outputs differ", "")
    assert raised.value.clause == "sdpa.varlen", str(raised.value)


class WindowOneKeyWide:
    """A flash wrapper that kept one key too many on a window's left (transformers issue #39408): correct otherwise."""

    DTYPES = ("float64",)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None):
        wider = None if window is None else (None if window[0] is None else window[0] + 1, window[1])
        return oracle.sdpa(q, k, v, mask, is_causal, scale, window=wider).astype(q.dtype)


def test_a_case_whose_rows_weigh_one_key_each_is_not_probed_for_the_layout(kept_records):
    """Window (0, 0) on one head keeps each query's own key alone: the output copies v's rows, and so does the other
    layout's reading (one key a row, the kv head read as the keys), whatever the fault. The window's fault stays
    sdpa.window's (it was filed under contract.layout)."""
    q, k, v = np.array([[[[1.0], [-2.0], [0.5]]]]), np.array([[[[3.0], [1.0], [-1.0]]]]), np.array([[[[1.0], [2.0],
                                                                                                       [4.0]]]])
    case = Case("sdpa", {"q": q, "k": k, "v": v, "window": (0, 0)}, ("sdpa.window",), "window-diagonal-only")
    judge = Judge(load_implementation("tests.test_layout:WindowOneKeyWide"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    assert raised.value.clause == "sdpa.window", str(raised.value)


def test_an_output_in_the_other_layout_is_a_shape_failure_naming_the_layout(kept_records):
    judge = Judge(load_implementation(f"{SPEC}:NumpyBLHDWrongOutput"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(_sdpa_case())
    assert raised.value.clause == "sdpa.output-shape"
    assert "output shape (2, 3, 5, 2), expected (2, 5, 3, 2) (LAYOUT 'blhd': (B, L, H, D))" in str(raised.value)


def test_a_write_to_a_transposed_input_is_still_seen(kept_records):
    judge = Judge(load_implementation(f"{SPEC}:NumpyBLHDWritesQ"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(_sdpa_case())
    assert raised.value.clause == "contract.inputs-unchanged" and "mutated input q" in str(raised.value)


def test_the_repro_hands_the_layout_the_implementation_takes(kept_records):
    """The repro of a blhd implementation calls it through impl.call, which transposes: a correct one shows no
    error; the snippet says so in a comment."""
    case = _sdpa_case(scale=0.7)
    judge = Judge(load_implementation(f"{SPEC}:NumpyBLHD"), "float64", "cpu")
    snippet = judge._snippet(case, case.rounded("float64"))
    assert "LAYOUT 'blhd' (B, L, H, D)" in snippet
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = dict(line.rsplit(" ", 1) for line in done.stdout.strip().splitlines())
    assert float(printed["max abs error"]) < 1e-12, done.stdout


def test_gradients_come_back_in_the_suites_layout():
    pytest.importorskip("torch")
    case = _sdpa_case(is_causal=True)
    inputs = dict(case.rounded("float64"))
    d_out = np.random.default_rng(1).standard_normal((2, 3, 5, 2))
    got = {member: gradients(load_implementation(f"{SPEC}:{member}"), inputs, d_out, "cpu")
           for member in ("TorchBLHD", "TorchBHLD")}
    assert got["TorchBLHD"]["out"].shape == d_out.shape
    for name, of in (("dq", "q"), ("dk", "k"), ("dv", "v")):
        assert got["TorchBLHD"][name].shape == inputs[of].shape
    for name in ("out", "dq", "dk", "dv"):
        np.testing.assert_allclose(got["TorchBLHD"][name], got["TorchBHLD"][name], rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["bshd", "BLHD", ("b", "l", "h", "d"), None])
def test_an_unknown_layout_is_a_load_error_naming_the_attribute(layout):
    obj = types.SimpleNamespace(sdpa=NumpyBHLD.sdpa, LAYOUT=layout)
    with pytest.raises(ImplementationLoadError) as raised:
        from_object(obj, "mine", "my_module:mine")
    assert str(raised.value).startswith(f"my_module:mine: LAYOUT={layout!r} must be one of ['bhld', 'blhd']")


def test_the_report_shows_the_layout():
    assert load_implementation(f"{SPEC}:NumpyBLHD").describe()["layout"] == "blhd"
    assert load_implementation(f"{SPEC}:NumpyBHLD").describe()["layout"] == "bhld"


# ------------------------------------------------------------------ OUTPUT_LAYOUT
def test_a_declared_output_layout_passes_everything_its_bhld_twin_passes():
    results = {member: run_battery(load_implementation(f"{SPEC}:{member}"), dtypes=("float64",), max_examples=4,
                                   brief=True) for member in ("NumpyHFStyle", "NumpyBHLD")}
    for member, verdicts in results.items():
        assert not verdicts.errors and not verdicts.failures, (member, verdicts.errors[:3], verdicts.failures[:5])
    assert results["NumpyHFStyle"].passed == results["NumpyBHLD"].passed > 0


@pytest.mark.parametrize("member, declared, message", [
    ("NumpyHFStyleUndeclared", None, "output shape (2, 5, 3, 2), expected (2, 3, 5, 2)"),
    ("NumpyBHLD", "blhd", "output shape (2, 3, 5, 2), expected (2, 5, 3, 2) (OUTPUT_LAYOUT 'blhd': (B, L, H, D))"),
])
def test_an_output_in_another_layout_than_declared_is_a_shape_failure(kept_records, member, declared, message):
    impl = load_implementation(f"{SPEC}:{member}")
    judge = Judge(dataclasses.replace(impl, output_layout=declared) if declared else impl, "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(_sdpa_case())
    assert raised.value.clause == "sdpa.output-shape" and message in str(raised.value)


def test_output_layout_gradients_take_d_out_in_it():
    pytest.importorskip("torch")
    inputs = dict(_sdpa_case(is_causal=True).rounded("float64"))
    d_out = np.random.default_rng(1).standard_normal((2, 3, 5, 2))
    got = {member: gradients(load_implementation(f"{SPEC}:{member}"), inputs, d_out, "cpu")
           for member in ("TorchHFStyle", "TorchBHLD")}
    for name in ("out", "dq", "dk", "dv"):
        np.testing.assert_allclose(got["TorchHFStyle"][name], got["TorchBHLD"][name], rtol=0, atol=1e-12)


def test_the_repro_reads_the_output_layout(kept_records):
    case = _sdpa_case(scale=0.7)
    snippet = Judge(load_implementation(f"{SPEC}:NumpyHFStyle"), "float64", "cpu")._snippet(case,
                                                                                          case.rounded("float64"))
    assert "reads its output as 'blhd'" in snippet and "hands q, k, v" not in snippet
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = dict(line.rsplit(" ", 1) for line in done.stdout.strip().splitlines())
    assert float(printed["max abs error"]) < 1e-12, done.stdout


def test_output_layout_is_checked_and_reported():
    with pytest.raises(ImplementationLoadError) as raised:
        from_object(types.SimpleNamespace(sdpa=NumpyBHLD.sdpa, OUTPUT_LAYOUT="bshd"), "mine", "my_module:mine")
    assert str(raised.value).startswith("my_module:mine: OUTPUT_LAYOUT='bshd' must be one of ['bhld', 'blhd']")
    described = load_implementation(f"{SPEC}:NumpyHFStyle").describe()
    assert (described["layout"], described["output_layout"]) == ("bhld", "blhd")
    assert load_implementation(f"{SPEC}:NumpyBLHD").describe()["output_layout"] == "blhd"

"""A new array framework is added in one place: its adapter (implementations/_arrays.py).

The end-to-end check writes a toy framework ("fakearray": NumPy arrays in a wrapper,
with a __version__) and one module that registers its adapter and implements sdpa
on it, then runs the conformance suite against that module: devices,
parametrisation, conversion, the report's versions and the gradient tests' choice
all come from the one adapter, with no other module of the suite touched.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from attention_conformance.conformance.harness import checks
from attention_conformance.conformance.reporting import environment
from attention_conformance.conformance.specdata import ROOT
from attention_conformance.implementations import arrays as _arrays

pytestmark = pytest.mark.selfcheck

FAKEARRAY = '''
"""A toy array framework: NumPy arrays in a wrapper the suite cannot mistake for NumPy."""
import numpy as np

__version__ = "0.4.2"


class FakeArray:
    def __init__(self, data):
        self.data = np.asarray(data)

    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
'''

FAKE_ATTENTION = '''
"""sdpa on fakearray, and the adapter that lets the suite test it: the one place the framework is declared."""
import sys

import numpy as np

import fakearray
from attention_conformance.implementations.arrays import ArrayAdapter, register


class FakeArrays(ArrayAdapter):
    kind = "fakearray"
    DEVICES = ("cpu",)
    VERSION_MODULES = ("fakearray",)

    def to_native(self, array, device):
        return fakearray.FakeArray(array.copy())

    def to_numpy(self, value):
        return value.data if isinstance(value, fakearray.FakeArray) else np.asarray(value)


register(FakeArrays())

ARRAY = "fakearray"
NAME = "fake"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    for name, value in (("q", q), ("k", k), ("v", v), ("mask", mask)):
        if value is not None and not isinstance(value, fakearray.FakeArray):
            raise TypeError(f"{name} is {type(value).__name__}, not a FakeArray: the adapter was bypassed")
    q, k, v = q.data, k.data, v.data
    mask = None if mask is None else mask.data
    g = q.shape[1] // k.shape[1]
    s = q @ np.swapaxes(np.repeat(k, g, 1), -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    s = np.where(mask, s, -np.inf) if mask is not None and mask.dtype == bool else s + (0 if mask is None else mask)
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf) if is_causal else s
    w = np.exp(s - np.nan_to_num(s.max(-1, keepdims=True), neginf=0))
    total = w.sum(-1, keepdims=True)
    w = w / np.where(total == 0, 1, total)
    return fakearray.FakeArray((w @ np.repeat(v, g, 1)).astype(q.dtype))
'''


def test_a_toy_framework_registered_in_one_module_runs_through_the_suite(tmp_path):
    (tmp_path / "fakearray.py").write_text(textwrap.dedent(FAKEARRAY))
    (tmp_path / "fake_attention.py").write_text(textwrap.dedent(FAKE_ATTENTION))
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("PYTEST_XDIST_WORKER", "ATTENTION_CONFORMANCE_IMPL", "PYTEST_ADDOPTS")}
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), environment.get("PYTHONPATH")]))
    report = tmp_path / "r.json"
    # Under xdist (-n 1), as a default run: the worker imports the module, so registers the adapter, too.
    command = [sys.executable, "-m", "pytest", "conformance", "-q", "-n", "1", "-p", "no:cacheprovider",
               "--impl", "fake_attention", "--hypothesis-profile", "dev", "--conformance-report", str(report),
               "-W", "ignore::DeprecationWarning", "-k", "test_fixture or sdpa or gradient"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    data = json.loads(report.read_text())
    assert data["environment"]["versions"]["fakearray"] == "0.4.2"
    described = data["implementations"][0]
    assert described["array"] == "fakearray" and described["devices"] == ["cpu"]
    counts = data["summary"]["fake"]
    assert counts["passed"] > 50 and counts["failed"] == 0, counts
    judged = {c["clause"] for c in data["cases"] if c["status"] == "passed"}
    assert {"sdpa.definition", "causal.top-left", "sdpa.gqa-mapping"} <= judged
    # No cuda item: the adapter offers only the CPU; the gradient tests skip it, since it does not differentiate.
    assert "fake-cuda" not in done.stdout
    assert not any(c["device"] == "cuda" for c in data["cases"])
    assert not any(c["clause"].startswith("grad.") for c in data["cases"])


class _Toy(_arrays.ArrayAdapter):
    kind = "toy"
    DEVICES = ("cpu", "npu")
    VERSION_MODULES = ("toy_framework_not_imported",)
    DIFFERENTIABLE = True

    def to_native(self, array, device):
        return array


def test_the_other_modules_derive_devices_versions_and_gradients_from_the_adapters(monkeypatch):
    monkeypatch.setitem(_arrays.ARRAY_KINDS, "toy", _Toy())
    assert _arrays.device_names() == ("cpu", "cuda", "npu")
    assert checks.array_devices("toy") == ("cpu", "npu") and checks.array_devices("numpy") == ("cpu",)
    assert _arrays.differentiable_kinds() == ("torch", "jax", "toy")
    toy_impl, numpy_impl = SimpleNamespace(array="toy", gradients=True, name="t"), SimpleNamespace(array="numpy", name="n")
    assert checks.without_autodiff(toy_impl) is None
    assert checks.without_autodiff(numpy_impl) == (
        "gradients are checked for ARRAY 'torch' or 'jax' or 'toy'; n has ARRAY 'numpy'")
    versions = environment.local_environment()["versions"]
    assert "toy_framework_not_imported" in versions and versions["toy_framework_not_imported"] is None
    assert list(versions)[:2] == ["python", "numpy"] and versions["numpy"] == np.__version__
    monkeypatch.delitem(_arrays.ARRAY_KINDS, "toy")
    assert _arrays.device_names() == ("cpu", "cuda") and _arrays.differentiable_kinds() == ("torch", "jax")


def test_register_rejects_an_adapter_without_a_kind_or_devices():
    class Nameless(_arrays.ArrayAdapter):
        pass

    class NoDevices(_arrays.ArrayAdapter):
        kind = "none"
        DEVICES = ()

    with pytest.raises(ValueError, match="needs a kind"):
        _arrays.register(Nameless())
    with pytest.raises(ValueError, match="DEVICES must be"):
        _arrays.register(NoDevices())
    assert "none" not in _arrays.ARRAY_KINDS


def test_every_suite_adapter_meets_the_contract_without_importing_its_framework():
    for kind, adapter in _arrays.ARRAY_KINDS.items():
        assert adapter.kind == kind and adapter.DEVICES and set(adapter.DEVICES) <= set(_arrays.device_names())
        assert set(adapter.versions()) == set(adapter.VERSION_MODULES)
        assert isinstance(adapter.device_info(), dict)
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert _arrays.ARRAY_KINDS["numpy"].to_numpy(_arrays.ARRAY_KINDS["numpy"].to_native(array, "cpu")) is array
    with pytest.raises(NotImplementedError, match="does not differentiate"):
        _arrays.ARRAY_KINDS["numpy"].vjp(lambda **a: None, {}, array, "cpu")

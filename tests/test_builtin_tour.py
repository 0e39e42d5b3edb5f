"""The dev profile's run without --impl tours the built-ins (conformance/plugin.py, docs/speed.md): the frameworks'
built-ins on each corner once and Hypothesis's first example, the suite's own arithmetic (REFERENCE_BUILTINS)
left out where torch or JAX is installed. Named implementations, entry points and the ci and thorough profiles keep
the full budget."""
from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from attention_conformance.conformance import plugin
from attention_conformance.conformance.harness import properties
from attention_conformance.implementations.builtin import REFERENCE_BUILTINS
from attention_conformance.implementations.region import EVERYTHING
from attention_conformance.implementations.registry import builtin_implementations

pytestmark = pytest.mark.selfcheck


def config(profile=None, impl=()):
    options = {"impl": list(impl), "no_builtins": False, "hypothesis_profile": profile}
    return SimpleNamespace(getoption=lambda name, default=None: options.get(name, default), stash={})


def test_the_dev_profile_tours_the_framework_builtins_with_one_random_example(monkeypatch):
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    monkeypatch.setattr(plugin, "_entry_point_implementations", list)
    chosen = config()
    toured = plugin.discover(chosen)
    assert chosen.stash[plugin.TOUR_LEFT_OUT_KEY] == REFERENCE_BUILTINS
    everything = {impl.name for impl in builtin_implementations()}
    assert {impl.name for impl in toured} == everything - set(REFERENCE_BUILTINS)
    assert all(properties.corners_only(impl) for impl in toured)
    for profile in ("ci", "thorough"):
        full = plugin.discover(config(profile))
        assert {impl.name for impl in full} == everything
        assert not any(properties.corners_only(impl) for impl in full)


def test_a_bare_run_says_what_its_tour_left_out():
    from .test_cli import pytest_run

    done = pytest_run("conformance/test_dropout.py")
    assert done.returncode == 0, done.stdout[-3000:]
    assert ("the dev profile's tour of the built-ins: each corner once, one Hypothesis example a property; "
            "numpy_oracle, numpy_native, jax_numpy left out") in done.stdout
    assert "left out" not in pytest_run("conformance/test_dropout.py", "--hypothesis-profile", "ci").stdout


def test_a_named_builtin_keeps_the_profiles_budget(monkeypatch):
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    named = plugin.discover(config(impl=["builtin:numpy_native", "builtin:torch_math"]))
    assert [impl.name for impl in named] == ["numpy_native", "torch_math"]
    assert not any(properties.corners_only(impl) for impl in named)


def test_without_torch_and_jax_the_reference_builtins_are_the_tour(monkeypatch):
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    monkeypatch.setattr(plugin, "_entry_point_implementations", list)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name in ("torch", "jax") else find_spec(name, *args))
    assert set(REFERENCE_BUILTINS) <= {impl.name for impl in plugin.discover(config())}


def test_a_toured_implementation_runs_each_corner_once_and_one_example():
    cheap = SimpleNamespace(compiled=False)
    assert properties.random_examples(cheap, EVERYTHING, 10, 3, 1) == 7
    cheap.corners_only = True
    assert properties.random_examples(cheap, EVERYTHING, 10, 3, 1) == 1
    compiling = SimpleNamespace(compiled=True, corners_only=True)
    assert properties.random_examples(compiling, EVERYTHING, 10, 6, 1) == 1

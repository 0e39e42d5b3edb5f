"""What the plugin does for speed: each xdist worker's share of the cores, JAX's compilation cache, no
framework import on the controller, absent devices skipped at collection, a smaller example budget for
compiled (JAX) implementations."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from attention_conformance.conformance import plugin
from attention_conformance.conformance.cases import fixtures
from attention_conformance.conformance.harness import session
from attention_conformance.conformance.specdata import ROOT
from attention_conformance.implementations.registry import from_object

pytestmark = pytest.mark.selfcheck


def fake_config(cache="auto", rootpath="/repo", pytest_cache=None):
    return SimpleNamespace(rootpath=Path(rootpath), getoption=lambda name, default=None: cache, cache=pytest_cache)


@pytest.fixture
def clean_environment(monkeypatch):
    for variable in (*plugin.THREAD_VARIABLES, "JAX_COMPILATION_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                     "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.delitem(sys.modules, "jax", raising=False)  # this worker's JAX keeps its own settings
    return monkeypatch


def test_each_worker_gets_its_share_of_the_cores(clean_environment):
    plugin.share_cores_between_workers(2)
    assert {os.environ[v] for v in plugin.THREAD_VARIABLES} == {"2"}


def test_more_workers_than_cores_still_get_one_thread(clean_environment):
    plugin.share_cores_between_workers(8)
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_the_controller_sets_the_share_before_the_workers_start(clean_environment):
    # Workers import NumPy (and so OpenBLAS) before any hook of theirs runs: only inherited variables reach it.
    from attention_conformance import pytest_plugin

    config = fake_config()
    config.stash = {pytest_plugin.ENGAGED_KEY: True}  # a run of the suite
    pytest_plugin.pytest_xdist_setupnodes(config=config, specs=["gw0", "gw1", "gw2", "gw3"])
    assert {os.environ[v] for v in plugin.THREAD_VARIABLES} == {"1"}


def test_a_thread_count_the_user_set_is_kept(clean_environment):
    clean_environment.setenv("OMP_NUM_THREADS", "3")
    plugin.share_cores_between_workers(2)
    assert os.environ["OMP_NUM_THREADS"] == "3" and os.environ["OPENBLAS_NUM_THREADS"] == "2"


def test_the_compile_caches_live_under_pytests_cache_and_cache_every_compile(clean_environment, tmp_path):
    class PytestCache:  # config.cache's one method used here
        def mkdir(self, name):
            (tmp_path / "d" / name).mkdir(parents=True, exist_ok=True)
            return tmp_path / "d" / name

    plugin.share_jax_compilations(fake_config(pytest_cache=PytestCache()))
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "d" / "attention-conformance" / "jax")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "d" / "attention-conformance" / "torchinductor")
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"


def test_without_pytests_cache_the_jax_cache_lives_under_the_rootdir(clean_environment):
    plugin.share_jax_compilations(fake_config(rootpath="/repo"))
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(Path("/repo/.attention-conformance/jax"))
    plugin.share_jax_compilations(fake_config(cache="cache/jax-here"))  # the variable set above wins
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(Path("/repo/.attention-conformance/jax"))
    clean_environment.delenv("JAX_COMPILATION_CACHE_DIR")
    plugin.share_jax_compilations(fake_config(cache="cache/jax-here"))
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(Path("/repo/cache/jax-here"))


def test_a_jax_imported_before_the_session_is_pointed_at_the_cache_too(clean_environment, tmp_path):
    """A conftest.py or a plugin that imports JAX at its top does so before the session starts, when JAX reads the
    variables: its configuration is updated as well (else the cache was off for the whole process)."""
    updates = {}
    clean_environment.setitem(sys.modules, "jax", SimpleNamespace(config=SimpleNamespace(update=updates.__setitem__)))
    clean_environment.setenv("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "4096")  # the user's own, kept
    plugin.share_jax_compilations(fake_config(cache=str(tmp_path / "jax")))
    assert updates == {"jax_compilation_cache_dir": str(tmp_path / "jax"),
                       "jax_persistent_cache_min_compile_time_secs": 0.0,
                       "jax_persistent_cache_min_entry_size_bytes": 4096}
    updates.clear()
    plugin.share_jax_compilations(fake_config(cache="off"))
    assert updates == {}


@pytest.mark.parametrize("cache, preset", [("off", None), ("auto", "/mine")])
def test_off_or_a_users_cache_leaves_jax_alone(clean_environment, cache, preset):
    if preset:
        clean_environment.setenv("JAX_COMPILATION_CACHE_DIR", preset)
    plugin.share_jax_compilations(fake_config(cache=cache))
    assert os.environ.get("JAX_COMPILATION_CACHE_DIR") == preset
    assert "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ


def test_loading_the_builtins_imports_no_framework():
    # The xdist controller loads every implementation but runs no case: torch and JAX are imported by the workers.
    probe = ("import sys; from attention_conformance.implementations.registry import builtin_implementations; "
             "impls = builtin_implementations(); assert impls; "
             "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def torch_like_on_cpu_only(monkeypatch, dtypes):
    """A torch sdpa-only implementation on a machine with a CPU and no GPU, and a config running it."""
    from attention_conformance.implementations.registry import from_object

    class TorchLike:
        ARRAY = "torch"
        DTYPES = dtypes

        @staticmethod
        def sdpa(q, k, v):
            return q

    impl = from_object(TorchLike, "torch_like", "tests:TorchLike")
    monkeypatch.setattr(impl, "devices", lambda: ["cpu"])
    config = SimpleNamespace(getoption=lambda name: {"device": "all", "dtype": []}[name],
                             stash={session.IMPLS_KEY: [impl]})
    return impl, config


def test_an_absent_device_is_marked_at_collection_with_its_reason(monkeypatch):
    _, config = torch_like_on_cpu_only(monkeypatch, ("float32",))
    params = {p.id: p for p in plugin.implementation_params(config, "sdpa")}
    assert not params["torch_like-cpu-float32"].marks
    skip, absent = params["torch_like-cuda"].marks
    assert skip.name == "skip" and skip.kwargs["reason"] == "cuda is not available to torch_like (torch) on this machine"
    assert absent.name == "absent_device" and absent.kwargs == {"device": "cuda", "impl": "torch_like"}


def test_what_cannot_run_is_one_skipped_item_per_device_not_one_per_dtype(monkeypatch):
    impl, config = torch_like_on_cpu_only(monkeypatch, ("float16", "float32", "float64"))
    sdpa = {p.id: p for p in plugin.implementation_params(config, "sdpa")}
    assert sorted(sdpa) == ["torch_like-cpu-float16", "torch_like-cpu-float32", "torch_like-cpu-float64",
                            "torch_like-cuda"]
    assert sdpa["torch_like-cuda"].values == (impl, "cuda", None)
    softmax = {p.id: p for p in plugin.implementation_params(config, "softmax")}
    assert sorted(softmax) == ["torch_like-cpu", "torch_like-cuda"]
    assert softmax["torch_like-cpu"].marks[0].kwargs["reason"] == "not implemented: torch_like does not expose softmax"
    # Fixtures: the missing operation is one item per operation, the absent device one item in all.
    rows = [r.id for r in plugin._fixture_rows(plugin.implementation_params(config, None))]
    assert rows.count("torch_like-cuda") == 1
    assert {"torch_like-cpu-softmax", "torch_like-cpu-multi_head_attention"} <= set(rows)
    assert len([r for r in rows if r.endswith("torch_like-cpu-float32")]) == len(
        [fx for fx in fixtures.fixtures() if fx.op == "sdpa" and fx.runs_in("float32")])


@pytest.mark.parametrize("spec, max_examples, judged, floor, expected", [
    ("jax", 30, 0, 0, 3), ("jax", 10, 0, 0, 1), ("numpy", 10, 0, 0, 10), ("compiled", 10, 0, 0, 1),
    ("numpy", 10, 9, 12, 2),  # a cheap, broad implementation keeps MIN_RANDOM_EXAMPLES beside its corners
    ("jax", 10, 4, 12, 8),  # a compiling one is brought up to the floor of judged examples (full covering set)
])
def test_compiled_implementations_draw_a_tenth_of_the_random_examples(spec, max_examples, judged, floor, expected):
    """The budget of random examples after the covering set (conformance/properties.py, random_examples)."""
    from attention_conformance.conformance.harness.properties import random_examples

    # ARRAY="jax" compiles per input signature; so does a declared COMPILED=True (torch.compile, say).
    attributes = {"ARRAY": "jax"} if spec == "jax" else ({"COMPILED": True} if spec == "compiled" else {})
    impl = from_object(type("Impl", (), {**attributes, "sdpa": staticmethod(lambda q, k, v: q)}), spec, spec)
    assert random_examples(impl, impl.region, max_examples, judged, 1, floor=floor) == expected


def test_a_test_that_does_not_apply_is_skipped_at_collection_not_expected_judged(monkeypatch):
    """A test's applies_to marker (property_test(requires=...)) decides at collection: the item is skipped with the
    reason, so the coverage rule never counts it runnable (test_gradients.py run alone had failed the rule for the
    NumPy built-ins and a forward-only flex)."""
    from attention_conformance.conformance.harness.checks import without_autodiff
    from attention_conformance.conformance.test_gradients import test_sdpa_gradients

    impl, config = torch_like_on_cpu_only(monkeypatch, ("float32",))
    (marker,) = [m for m in test_sdpa_gradients.pytestmark if m.name == "applies_to"]
    (applies,) = marker.args  # property_test's applicability: requires=without_autodiff, then derived cases
    assert applies(impl) is None is without_autodiff(impl)
    monkeypatch.setattr(impl, "gradients", False)
    assert applies(impl) == without_autodiff(impl)
    params = {p.id: p for p in plugin.implementation_params(config, "sdpa", applies)}
    (mark,) = params["torch_like-cpu"].marks
    assert mark.kwargs["reason"] == "torch_like declares GRADIENTS = False (a forward-only sdpa)"
    assert params["torch_like-cpu"].values == (impl, "cpu", None)


def test_after_an_item_that_imported_modules_every_live_object_is_frozen(monkeypatch):
    # A framework's first use imports millions of objects that every full collection would scan again.
    import gc

    monkeypatch.setattr(plugin, "_MODULES_AT_FREEZE", [0])
    frozen, thresholds = [], []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(len(sys.modules)))
    monkeypatch.setattr(gc, "set_threshold", lambda *counts: thresholds.append(counts))
    plugin.freeze_after_imports()
    assert frozen == [len(sys.modules)]
    assert thresholds[-1] == (*gc.get_threshold()[:2], plugin.FULL_COLLECTION_EVERY)
    plugin.freeze_after_imports()  # no new module: nothing to freeze
    assert len(frozen) == 1
    monkeypatch.setitem(sys.modules, "an_imported_framework", SimpleNamespace())
    plugin.freeze_after_imports()
    assert frozen[-1] == len(sys.modules) and len(frozen) == 2


def test_items_are_grouped_by_implementation_compiling_ones_first():
    """worksteal keeps the head of each worker's share and steals from the tail: with the compiling implementations
    first, each compiles its programs in one worker (jax_dpa, last before, was split between the two: 24 of its
    programs compiled twice in a cold default run)."""
    def item(name, impl_name, compiled):
        impl = SimpleNamespace(name=impl_name, compiled=compiled)
        return SimpleNamespace(nodeid=name, callspec=SimpleNamespace(params={"impl": impl}))

    items = [item("a1", "numpy_native", False), item("b1", "jax_dpa", True), item("a2", "numpy_native", False),
             item("c1", "torch_math", False), item("b2", "jax_dpa", True), item("d1", "torch_flex_cpu", True),
             SimpleNamespace(nodeid="plain", callspec=None)]
    plugin.order_by_implementation(items)
    assert [i.nodeid for i in items] == ["b1", "b2", "d1", "a1", "a2", "c1", "plain"]


def test_torch_trace_records_stay_out_of_failure_reports_unless_asked_for(monkeypatch):
    """pytest's log capture attaches to non-propagating loggers, torch's structured-trace one among them: its empty
    DEBUG records were 45 % of the H100 run's log. Disabled, a record no longer reaches a handler; with $TORCH_TRACE
    (torch's own trace files) the logger is left alone."""
    import logging

    logger = logging.getLogger(plugin.TORCH_TRACE_LOGGER)
    monkeypatch.setattr(logger, "disabled", False)
    seen = []
    handler = logging.Handler(level=logging.DEBUG)
    handler.emit = seen.append
    monkeypatch.setattr(logger, "handlers", [handler])
    monkeypatch.setattr(logger, "level", logging.DEBUG)
    monkeypatch.setenv("TORCH_TRACE", "/tmp/trace")
    assert not plugin.quiet_torch_trace_log()
    logger.debug("")
    assert len(seen) == 1
    monkeypatch.delenv("TORCH_TRACE")
    assert plugin.quiet_torch_trace_log()
    logger.debug("")
    assert len(seen) == 1

"""What the plugin sets up for speed: each xdist worker's share of the cores, and JAX's compilation cache."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance import plugin

pytestmark = pytest.mark.selfcheck


def fake_config(workercount=None, cache=".attention-conformance/jax-cache", rootpath="/repo"):
    config = SimpleNamespace(rootpath=Path(rootpath), getoption=lambda name, default=None: cache)
    if workercount is not None:
        config.workerinput = {"workercount": workercount}
    return config


@pytest.fixture
def clean_environment(monkeypatch):
    for variable in (*plugin.THREAD_VARIABLES, "JAX_COMPILATION_CACHE_DIR",
                     "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    return monkeypatch


def test_each_worker_gets_its_share_of_the_cores(clean_environment):
    plugin.share_cores_between_workers(fake_config(workercount=2))
    assert {os.environ[v] for v in plugin.THREAD_VARIABLES} == {"2"}


def test_more_workers_than_cores_still_get_one_thread(clean_environment):
    plugin.share_cores_between_workers(fake_config(workercount=8))
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_the_controller_and_a_plain_run_keep_their_threads(clean_environment):
    plugin.share_cores_between_workers(fake_config())
    assert not any(v in os.environ for v in plugin.THREAD_VARIABLES)


def test_a_thread_count_the_user_set_is_kept(clean_environment):
    clean_environment.setenv("OMP_NUM_THREADS", "3")
    plugin.share_cores_between_workers(fake_config(workercount=2))
    assert os.environ["OMP_NUM_THREADS"] == "3" and os.environ["OPENBLAS_NUM_THREADS"] == "2"


def test_the_jax_cache_lives_under_the_rootdir_and_caches_every_compile(clean_environment):
    plugin.share_jax_compilations(fake_config(rootpath="/repo"))
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == str(Path("/repo/.attention-conformance/jax-cache"))
    assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"


@pytest.mark.parametrize("cache, preset", [("off", None), (".attention-conformance/jax-cache", "/mine")])
def test_off_or_a_users_cache_leaves_jax_alone(clean_environment, cache, preset):
    if preset:
        clean_environment.setenv("JAX_COMPILATION_CACHE_DIR", preset)
    plugin.share_jax_compilations(fake_config(cache=cache))
    assert os.environ.get("JAX_COMPILATION_CACHE_DIR") == preset
    assert "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ

"""``--longest-first DURATIONS.json`` (conformance/reporting/ordering.py) and the GPU run that uses it.

The order is checked against pytest-xdist's own schedulers (the chunks ``worksteal`` and ``load`` cut, the item each
worker starts on), end to end in one process and under ``-n 2`` (xdist aborts a run whose workers collected
different orders, so a green run with the option is every worker computing the same one), and through
benchmarks/gpu_run_profile.py's simulation of the recorded H100 run. ``benchmarks/gpu_run.sh`` is run with stand-ins
for python3 and nvidia-smi: it passes the durations file and the compile caches to pytest.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import stat
import subprocess
import sys
from types import SimpleNamespace

import pytest
from xdist.scheduler import LoadScheduling, WorkStealingScheduling

from attention_conformance.conformance.reporting import ordering, shards
from attention_conformance.conformance.specdata import ROOT

pytestmark = [pytest.mark.selfcheck, pytest.mark.timeout(400)]

QUIET = SimpleNamespace(workstealsched=lambda *args: None, loadsched=lambda *args: None)
RECORDED = ROOT / "docs" / "gpu-runs" / "2026-11-27-h100"


def first_batches(scheduler_class, count: int, workers: int) -> list[list[int]]:
    """What xdist's scheduler sends each of ``workers`` idle workers for a collection of ``count`` items."""
    sent: list[list[int]] = [[] for _ in range(workers)]

    class Node:
        def __init__(self, index):
            self.index, self.shutting_down, self.gateway = index, False, SimpleNamespace(id=f"gw{index}")

        def send_runtest_some(self, indices):
            sent[self.index].extend(indices)

        def shutdown(self):
            self.shutting_down = True

    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"], getoption=lambda name, default=None: None)
    scheduler = scheduler_class(config, QUIET)
    nodes = [Node(i) for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, [str(i) for i in range(count)])
    scheduler.schedule()
    return sent


def items_and_durations(count: int, seed: int = 7):
    rng = random.Random(seed)
    nodeids = [f"conformance/test_x.py::test_{i % 9}[impl{i % 4}-cuda-float{16 * (1 + i % 2)}-{i}]"
               for i in range(count)]
    durations = {n: round(rng.expovariate(1.0) ** 3, 3) for n in nodeids if rng.random() < 0.9}
    return nodeids, durations


def test_the_priority_is_longest_first_ties_in_collection_order_then_the_unmeasured():
    nodeids = ["a", "b", "c", "d", "e", "f"]
    durations = {"b": 1.0, "d": 5.0, "e": 1.0, "f": 0.0}
    assert [nodeids[i] for i in ordering.priority(nodeids, durations)] == ["d", "b", "e", "f", "a", "c"]
    # one process (and every --dist but worksteal and load): the priority list itself
    assert ordering.layout(nodeids, durations) == ordering.priority(nodeids, durations)
    assert ordering.layout(nodeids, durations, 4, "loadscope") == ordering.priority(nodeids, durations)


@pytest.mark.parametrize("count, workers", [(5, 2), (37, 3), (100, 16), (5257, 16), (5945, 7)])
def test_the_chunks_are_those_xdist_cuts(count, workers):
    steal = first_batches(WorkStealingScheduling, count, workers)
    assert [len(batch) for batch in steal] == ordering.worksteal_chunks(count, workers)
    assert [i for batch in steal for i in batch] == list(range(count))  # contiguous, in order
    load = first_batches(LoadScheduling, count, workers)
    size = ordering.load_chunk(count, workers, None)
    assert all(len(batch) == size for batch in load) if size else all(len(batch) <= 2 for batch in load)


@pytest.mark.parametrize("dist", ["worksteal", "load"])
def test_each_worker_starts_on_one_of_the_longest_items(dist):
    workers = 16
    nodeids, durations = items_and_durations(3000)
    order = ordering.layout(nodeids, durations, workers, dist)
    assert sorted(order) == list(range(len(nodeids)))
    laid = [nodeids[i] for i in order]
    batches = first_batches(WorkStealingScheduling if dist == "worksteal" else LoadScheduling, len(laid), workers)
    heads = {laid[batch[0]] for batch in batches}
    longest = sorted(durations, key=lambda n: (-durations[n], nodeids.index(n)))[:workers]
    assert heads == set(longest)
    for batch in batches:  # each chunk keeps the priority order: its head is its longest, the short items at its tail
        seconds = [durations.get(laid[i], -1.0) for i in batch]
        assert seconds == sorted(seconds, reverse=True)
    if dist == "worksteal":  # the chunks' measured seconds are balanced within the longest item
        totals = [sum(durations.get(laid[i], 0.0) for i in batch) for batch in batches]
        assert max(totals) - min(totals) <= max(durations.values())


def test_the_order_is_a_function_of_the_collection_and_the_file_alone():
    nodeids, durations = items_and_durations(500)
    reversed_file = dict(reversed(list(durations.items())))
    first = ordering.layout(nodeids, durations, 16, "worksteal")
    assert ordering.layout(nodeids, reversed_file, 16, "worksteal") == first
    assert ordering.layout(list(nodeids), dict(durations), 16, "worksteal") == first


def load_profile():
    spec = importlib.util.spec_from_file_location("gpu_run_profile", ROOT / "benchmarks" / "gpu_run_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_longest_first_shortens_the_recorded_h100_run_in_xdists_own_scheduler(capsys):
    profile = load_profile()
    done = profile.main([str(RECORDED / "run1-16-workers.log.gz"), "--report", str(RECORDED / "run1-report.json.gz"),
                         "--top", "3"])
    printed = capsys.readouterr().out
    assert done == 0
    assert "5249 item-seconds (5257 items)" in printed and "busiest 376.7 s" in printed
    assert "outside the items (start-up, between items, the end) 24.5 s" in printed
    rows = dict(re.findall(r"^  (.+?)\s{2,}(\d+)\s+\d+$", printed, re.MULTILINE))
    assert int(rows["recorded run (the busiest worker)"]) == 377
    assert int(rows["worksteal, --longest-first"]) <= 330 < int(rows["worksteal, longest first without the layout"])
    # the simulator, on a collection whose long items sit in one worker's chunk, ends on them as the run did
    seconds = [1.0] * 150 + [60.0] * 10 + [1.0] * 160
    span, _ = profile.simulate(seconds, 16, "worksteal")
    laid = ordering.layout([str(i) for i in range(len(seconds))], {str(i): s for i, s in enumerate(seconds)}, 16,
                           "worksteal")
    better, _ = profile.simulate([seconds[i] for i in laid], 16, "worksteal")
    assert span >= 120.0  # two of the long items ran one after the other in one worker
    assert profile.list_scheduling(seconds, 16) == 60.0 <= better <= 61.0  # a worker holds its next item: 1 s more


def test_the_durations_file_of_the_gpu_run_is_the_recorded_runs():
    durations, _ = shards.read_durations(ROOT / "docs" / "gpu-runs" / "durations-cuda.json", option="--longest-first")
    assert len(durations) == 5257
    assert max(durations, key=durations.get).split("[")[1].startswith("torch_flex")


# ------------------------------------------------------------------ end to end
SELECTION = ["conformance/test_properties.py", "--impl", "examples.my_attention", "--dtype", "float64", "-k",
             "explicit_scale or default_scale or softmax_matches or causal_top_left or key_permutation"]
ITEM = "conformance/test_properties.py::test_{}[examples_my_attention-cpu-float64]"


def run_pytest(*args: str):
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("PYTEST_XDIST_WORKER", "ATTENTION_CONFORMANCE_IMPL", "PYTEST_ADDOPTS")}
    command = [sys.executable, "-m", "pytest", *SELECTION, "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning",
               *args]
    return subprocess.run(command, check=False, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=environment)


@pytest.fixture(scope="module")
def durations_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ordering") / "durations.json"
    measured = {ITEM.format("causal_top_left"): 9.0, ITEM.format("key_permutation"): 7.0,
                ITEM.format("default_scale"): 5.0}
    path.write_text(shards.durations_file(measured))
    return path


def test_one_process_runs_the_longest_first_then_the_unmeasured_in_collection_order(durations_file):
    plain = run_pytest("-n", "0", "--collect-only", "-q")
    collected = [line for line in plain.stdout.splitlines() if "::" in line]
    assert len(collected) == 5, plain.stdout[-2000:]
    done = run_pytest("-n", "0", "-v", "--longest-first", str(durations_file))
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"^(\S+::\S+) (?:PASSED|SKIPPED)", done.stdout, re.MULTILINE)
    measured = [ITEM.format(name) for name in ("causal_top_left", "key_permutation", "default_scale")]
    assert ran == measured + [n for n in collected if n not in measured]


def test_two_xdist_workers_collect_the_same_order_and_each_starts_on_a_longest_item(durations_file):
    done = run_pytest("-n", "2", "--dist", "worksteal", "-v", "--longest-first", str(durations_file))
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 workers [5 items]" in done.stdout and "Different tests collected" not in done.stdout
    first = {}
    for worker, nodeid in re.findall(r"^\[(gw\d)\] \[ *\d+%\] (?:PASSED|SKIPPED) (\S+)", done.stdout, re.MULTILINE):
        first.setdefault(worker, nodeid)
    assert set(first.values()) == {ITEM.format("causal_top_left"), ITEM.format("key_permutation")}


def test_a_missing_or_malformed_durations_file_is_a_usage_error(tmp_path):
    done = run_pytest("-n", "0", "--collect-only", "-q", "--longest-first", str(tmp_path / "none.json"))
    assert done.returncode == 4 and "--longest-first" in done.stderr and "no such file" in done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"durations": {"a": "slow"}}')
    done = run_pytest("-n", "0", "--collect-only", "-q", "--longest-first", str(bad))
    assert done.returncode == 4 and f"--longest-first {bad}: expected" in done.stderr
    done = run_pytest("-n", "0", "--collect-only", "-q", "--longest-first", "")  # empty: the ordering off
    assert done.returncode == 0 and re.search(r"\b5/\d+ tests collected", done.stdout), done.stdout[-2000:]


def test_the_gpu_run_passes_the_durations_file_and_shares_the_compile_caches(tmp_path):
    """benchmarks/gpu_run.sh with stand-ins for python3 and nvidia-smi that record how pytest was started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen.jsonl"
    stand_in = bin_dir / "python3"
    stand_in.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        f"with open({str(seen)!r}, 'a') as f:\n"
                        "    f.write(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
                        "if 'CACHE' in k}}) + '\\n')\n")
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho stand-in\n")
    for path in (stand_in, bin_dir / "nvidia-smi"):
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    environment = {k: v for k, v in os.environ.items() if "CACHE" not in k}
    environment.update(PATH=f"{bin_dir}{os.pathsep}{environment['PATH']}", OUT=str(tmp_path / "out"),
                       GPU_RUN_CACHE=str(tmp_path / "cache"), TRITON_CACHE_DIR=str(tmp_path / "mine"))
    done = subprocess.run(["bash", "benchmarks/gpu_run.sh", "30", "-k", "flex"], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [json.loads(line) for line in seen.read_text().splitlines()]
    pytest_run = next(run for run in runs if run["argv"][:2] == ["-m", "pytest"])
    argv = pytest_run["argv"]
    assert argv[argv.index("--longest-first") + 1] == "docs/gpu-runs/durations-cuda.json"
    assert argv[-2:] == ["-k", "flex"]  # the user's arguments last: theirs win
    env = pytest_run["env"]
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "cache" / "jax")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "torchinductor")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "mine")  # set by the user: kept
    assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
    limit = re.search(r'limit="\$\{1:-(\d+)\}"', (ROOT / "benchmarks" / "gpu_run.sh").read_text())
    assert int(limit[1]) <= 600  # one command of a lent machine (at most 10 minutes)

"""The repro directory stays within its bound (conformance/judging/repro_files.py) and what it keeps replays.

* Repeated failing runs into one directory (pytest's cache, as a user's runs) leave at most --repro-max-files files
  and --repro-max-bytes bytes; earlier runs' files make room for the new run's; a failure whose repro the bound left
  out says so in its block, and every repro command a run printed replays.
* Each large array is stored once, compressed, in a file of ``arrays/`` every repro file that holds it shares; an
  array no kept repro file refers to goes with the last file that held it.
* A repro file of the first format (every array inline) still replays; one whose shared array is gone says so.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from attention_conformance.conformance.harness import replay
from attention_conformance.conformance.judging import evidence, repro_files, verdict
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.repro_files import Limits
from attention_conformance.implementations.registry import load_implementation

from .test_cli import ROOT
from .test_repro import REPRO_LINE, failure_blocks, replayed, repro_command, sdpa_case

pytestmark = [pytest.mark.selfcheck, pytest.mark.usefixtures("kept_records")]

NOT_KEPT = "repro: not kept: "


def failing_run(cache: Path, *options: str) -> subprocess.CompletedProcess:
    """`pytest conformance --impl examples.wrong_axis_softmax` (26 failing tests) with pytest's cache in ``cache``,
    where its repro files go, as in a user's checkout."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTEST_XDIST_WORKER"}
    command = [sys.executable, "-m", "pytest", "conformance", "-q", "-n", "0", "-o", f"cache_dir={cache}",
               "--jax-compilation-cache", "off", "--hypothesis-profile", "dev", "-W", "ignore::DeprecationWarning",
               "--impl", "examples.wrong_axis_softmax", *options]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment)


def directory_size(directory: Path) -> tuple[int, int]:
    """(repro files, bytes of repro files and shared arrays) in ``directory``."""
    files = list(directory.glob("*.npz"))
    shared = list((directory / repro_files.SHARED_DIRECTORY).glob("*.npz"))
    return len(files), sum(path.stat().st_size for path in files + shared)


def test_repeated_failing_runs_stay_within_the_bound_and_what_they_print_replays(tmp_path):
    """Three runs into one directory: the first two bounded by count (a repro file of this module is about 1 kB),
    the third by bytes."""
    cache = tmp_path / "cache"
    where = cache / "d" / evidence.CACHE_SUBDIRECTORY / evidence.REPRO_SUBDIRECTORY
    for bound in (Limits(files=8, bytes=60_000), Limits(files=8, bytes=60_000), Limits(files=8, bytes=5_000)):
        done = failing_run(cache, "--repro-max-files", str(bound.files), "--repro-max-bytes", str(bound.bytes))
        assert done.returncode == 1, done.stdout[-3000:]
        files, size = directory_size(where)
        assert files <= bound.files and size <= bound.bytes, (bound, files, size)
        blocks = failure_blocks(done.stdout)
        printed = [REPRO_LINE.search(line).group(2) for block in blocks for line in block if REPRO_LINE.search(line)]
        refused = [line for block in blocks for line in block if NOT_KEPT in line]
        assert printed and refused and len(printed) + len(refused) == len(blocks), done.stdout[-3000:]
        named = f"--repro-max-bytes {repro_files.size_words(bound.bytes)}"  # in both reasons: full, or too large
        assert all(named in " ".join(block) for block in blocks if NOT_KEPT in "".join(block)), refused
        assert all((where / f"{Path(name).stem}.npz").is_file() for name in printed), (bound, printed)  # all kept
    assert files < bound.files  # the bytes bound the last run
    again = repro_command(printed[0], cwd=ROOT, env={})
    assert again.returncode == 1 and again.stdout.count("FAILED [") == 1, again.stdout + again.stderr


def test_repro_bound_options_are_checked(tmp_path):
    done = failing_run(tmp_path / "cache", "--repro-max-bytes", "lots")
    assert done.returncode == 4 and "--repro-max-bytes" in done.stderr, done.stderr[-2000:]


# ------------------------------------------------------------------ the store itself
def failure(seed: int = 7, lk: int = 5, scale: float = 2.0) -> ConformanceFailure:
    judge = verdict.Judge(load_implementation("zoo.broken_scale_ignored"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(sdpa_case(("sdpa.scale-explicit",), seed=seed, lk=lk, scale=scale))
    return raised.value


@pytest.fixture
def run_state(monkeypatch):
    """evidence's state as in a run that started now, with the bound given to the returned setter."""
    def start(limits: Limits, started: float | None = None) -> None:
        monkeypatch.setitem(evidence._STATE, "limits", limits)
        monkeypatch.setitem(evidence._STATE, "started", time.time() if started is None else started)
    return start


def age(path: Path, seconds: float) -> None:
    """Make ``path`` look written ``seconds`` ago."""
    when = time.time() - seconds
    os.utime(path, (when, when))


def test_a_large_array_is_stored_once_for_every_file_and_compressed(tmp_path):
    """Two failures of one case (two tests, say) share its large arrays; in each, the failed case and the test's
    argument are the same arrays, stored once."""
    big = failure(lk=5000)
    first = evidence.save(big.evidence, tmp_path)
    big.evidence.id = "0123456789"
    second = evidence.save(big.evidence, tmp_path)
    shared = list((tmp_path / repro_files.SHARED_DIRECTORY).glob("*.npz"))
    assert len(shared) == 2  # k and v of (1, 1, 5000, 4) and (1, 1, 5000, 2); q is small, inline
    meta = replay.load(first).meta
    assert sorted(meta["shared"]) == sorted(path.stem for path in shared)
    assert first.stat().st_size < 4000 and second.stat().st_size < 4000
    for path in (first, second):
        status, out = replayed(path)
        assert status == 1 and "FAILED [sdpa.scale-explicit]" in out, out


def test_the_test_argument_and_the_failed_case_are_stored_once(tmp_path):
    from .test_repro import KINDS, saved_failure

    path, _ = saved_failure(tmp_path, *KINDS["sdpa"][:2], **KINDS["sdpa"][3]())
    saved = replay.load(path)
    with np.load(path) as data:
        stored = [key for key in data.files if key.startswith("array/")]
    assert saved.kwargs["case"] is not None and len(stored) == 3  # q, k and v once, for the case and the argument
    assert replayed(path)[0] == 1


def test_earlier_runs_make_room_oldest_first_and_this_runs_files_are_never_dropped(tmp_path, run_state):
    run_state(Limits(files=3, bytes=10**8))
    earlier = [evidence.save(failure(seed=seed, lk=5000).evidence, tmp_path) for seed in (1, 2, 3)]
    for seconds, path in zip((300, 200, 100), earlier):
        age(path, seconds)
        for name in replay.load(path).meta["shared"]:  # touched just after the file that refers to it
            age(repro_files.shared_path(tmp_path, name), seconds - 1)
    run_state(Limits(files=3, bytes=10**8))
    kept = [evidence.save(failure(seed=seed).evidence, tmp_path) for seed in (11, 12)]
    assert not earlier[0].exists() and not earlier[1].exists() and earlier[2].exists()
    assert directory_size(tmp_path)[0] == 3
    # The two dropped files' large arrays went with them: only the oldest file left holds shared arrays.
    assert len(list((tmp_path / repro_files.SHARED_DIRECTORY).glob("*.npz"))) == 2
    kept.append(evidence.save(failure(seed=13).evidence, tmp_path))
    assert not earlier[2].exists() and not list((tmp_path / repro_files.SHARED_DIRECTORY).glob("*.npz"))
    with pytest.raises(evidence.NotKept, match="this run's repro files fill the directory's bound"):
        evidence.save(failure(seed=14).evidence, tmp_path)
    assert all(path.exists() for path in kept) and directory_size(tmp_path)[0] == 3
    evidence.save(failure(seed=13).evidence, tmp_path)  # the same failure again overwrites its own file


def test_a_repro_over_the_byte_bound_is_refused_and_the_block_says_why(tmp_path, run_state, monkeypatch):
    from types import SimpleNamespace

    from attention_conformance.conformance.reporting import failure_block

    run_state(Limits(files=10, bytes=20_000))
    monkeypatch.setitem(evidence._STATE, "directory", tmp_path)
    big = failure(lk=5000)
    item = SimpleNamespace(config=SimpleNamespace(option=SimpleNamespace(tbstyle="auto")),
                           location=("conformance/test_properties.py", 41, "test_x"))
    report = SimpleNamespace(failed=True, longrepr="pytest's traceback")
    failure_block.after_test(item, SimpleNamespace(excinfo=SimpleNamespace(value=big)), report)
    text = str(report.longrepr)
    assert "repro: not kept: its" in text and "exceed --repro-max-bytes 20 kB" in text, text
    assert "attention-conformance repro " not in text and directory_size(tmp_path) == (0, 0)
    assert not big.record.repro_id  # the report names no repro for it


def test_prune_brings_a_directory_within_its_bound_at_a_runs_start(tmp_path):
    for index in range(6):
        path = evidence.save(failure(seed=index).evidence, tmp_path)
        age(path, 600 - index)
    (tmp_path / ".0123456789.4242.partial.npz").write_bytes(b"cut short")
    age(tmp_path / ".0123456789.4242.partial.npz", 600)
    repro_files.prune(tmp_path, Limits(files=2, bytes=10**8), time.time())
    left = sorted(tmp_path.glob("*.npz"), key=lambda path: path.stat().st_mtime)
    assert len(left) == 2 and not list(tmp_path.glob(".*.partial.npz"))
    assert all(replayed(path)[0] == 1 for path in left)


def test_a_first_format_file_still_replays_and_a_missing_shared_array_is_named(tmp_path):
    path = evidence.save(failure(lk=5000).evidence, tmp_path)
    saved = replay.load(path)
    meta = {**saved.meta, "format": 1}
    arrays = {f"case/{name}": np.asarray(value) for name, value in saved.case.inputs.items()
              if isinstance(value, np.ndarray)}
    old = tmp_path / "old" / "abcdefabcd.npz"
    old.parent.mkdir()
    np.savez(old, meta=np.array(json.dumps(meta)), **arrays)
    status, out = replayed(old)
    assert status == 1 and "FAILED [sdpa.scale-explicit]" in out, out

    for shared in (tmp_path / repro_files.SHARED_DIRECTORY).glob("*.npz"):
        shared.unlink()
    with pytest.raises(evidence.ReproError, match=r"its array \w+ is not in .*arrays"):
        replay.load(path)
    missing = repro_command(str(path), cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert missing.returncode == 2 and re.search(r"its array \w+ is not in", missing.stderr), missing.stderr


def test_sizes_read_as_bytes():
    assert [repro_files.parse_size(text) for text in ("200MB", "1.5G", "500k", "1234", "20 kB")] == \
        [200 * 10**6, 1_500_000_000, 500_000, 1234, 20_000]
    with pytest.raises(ValueError):
        repro_files.parse_size("lots")

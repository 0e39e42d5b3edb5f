"""The suite's default run against a peer conformance suite's own run on the same machine: array-api-tests
(github.com/data-apis/array-api-tests) on array_api_strict, its default settings, two workers.

    python benchmarks/peer_speed.py --peer PEER_DIR --peer-python PEER_VENV/bin/python --pairs 3
    python benchmarks/peer_speed.py --peer PEER_DIR --peer-python PEER_VENV/bin/python --numpy-module

Each pair runs, one after the other (which goes first alternates between pairs, so the machine's drift within the
hour falls on both sides):

* the suite's default run, ``python -m pytest conformance -n 2 -p no:cacheprovider -q`` at the root of this
  checkout (JAX's compilation cache as a default run leaves it: ``.attention-conformance/jax``, warm after a first
  run; ``--cold`` empties it first);
* with ``--numpy-module``, also one NumPy implementation: the same with ``--impl examples.my_attention``;
* the peer's run, ``ARRAY_API_TESTS_MODULE=array_api_strict python -m pytest array_api_tests -n 2`` in PEER_DIR
  with PEER_PYTHON (a virtual environment of its own: ``pip install array_api_strict -r requirements.txt
  pytest-xdist``; the clone needs its ``array-api`` submodule: ``git clone --recurse-submodules``).

It prints each run's wall time (around the subprocess: interpreter start and exit included), its CPU time (user +
system of pytest and its workers) and outcome line, the ratio suite / peer of each pair, and the median ratio. The
peer's verdicts do not matter here (array_api_strict fails a few dozen of its special cases); the suite's run must
be green, else the pair is reported as such. Not part of any test run: measure on an otherwise idle machine, and
compare medians of several pairs (docs/speed.md).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE_RUN = ["-m", "pytest", "conformance", "-n", "2", "-p", "no:cacheprovider", "-q"]
NUMPY_MODULE = ["--impl", "examples.my_attention"]
PEER_RUN = ["-m", "pytest", "array_api_tests", "-n", "2"]
PEER_MODULE = "array_api_strict"
OUTCOME = re.compile(r"\d+ (passed|failed|skipped|errors?)")


def timed(command: list[str], cwd: Path, env: dict) -> dict:
    """Run ``command``; its wall and CPU seconds, exit status and pytest's last outcome line."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [line.strip("= ") for line in (done.stdout + done.stderr).splitlines() if OUTCOME.search(line)]
    return {"exit": done.returncode, "wall_s": round(wall, 2), "cpu_s": round(cpu, 1),
            "outcome": lines[-1] if lines else (done.stdout + done.stderr)[-500:]}


def suite_run(extra: list[str]) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "JAX_COMPILATION_CACHE_DIR"}
    return timed([sys.executable, *SUITE_RUN, *extra], ROOT, env)


def peer_run(peer: Path, python: str) -> dict:
    return timed([python, *PEER_RUN], peer, {**os.environ, "ARRAY_API_TESTS_MODULE": PEER_MODULE})


def show(name: str, record: dict) -> None:
    print(f"  {name:<13} {record['wall_s']:7.1f} s wall {record['cpu_s']:7.1f} s CPU  exit {record['exit']}  "
          f"{record['outcome']}", flush=True)


def one_pair(index: int, args) -> dict:
    """One pair (with --numpy-module, a triple): the suite's runs and the peer's, the order alternating."""
    pair: dict = {}
    runs = [("suite", lambda: suite_run([]))]
    if args.numpy_module:
        runs.append(("numpy module", lambda: suite_run(NUMPY_MODULE)))
    runs.append(("peer", lambda: peer_run(args.peer, args.peer_python)))
    if index % 2:
        runs.reverse()
    print(f"pair {index + 1}/{args.pairs}", flush=True)
    for name, run in runs:
        if args.cold and name == "suite":
            shutil.rmtree(ROOT / ".attention-conformance" / "jax", ignore_errors=True)
        pair[name] = run()
        show(name, pair[name])
    pair["ratio"] = pair["suite"]["wall_s"] / pair["peer"]["wall_s"]
    line = f"  ratio suite / peer {pair['ratio']:.2f}x"
    if args.numpy_module:
        pair["numpy_ratio"] = pair["numpy module"]["wall_s"] / pair["peer"]["wall_s"]
        line += f"; numpy module / peer {pair['numpy_ratio']:.3f}x"
    print(line + ("" if pair["suite"]["exit"] == 0 else "  (the suite's run was not green)"), flush=True)
    return pair


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", type=Path, required=True, help="a checkout of array-api-tests (with its submodule)")
    parser.add_argument("--peer-python", required=True, help="the Python of a virtual environment with "
                        "array_api_strict, array-api-tests' requirements and pytest-xdist")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--numpy-module", action="store_true", help="also time --impl examples.my_attention")
    parser.add_argument("--cold", action="store_true", help="empty JAX's compilation cache before each suite run")
    parser.add_argument("--json", default=None, help="append every pair's record here (JSON lines)")
    args = parser.parse_args(argv)
    if not (args.peer / "array_api_tests").is_dir():
        parser.error(f"{args.peer} holds no array_api_tests/ (clone data-apis/array-api-tests with its submodule)")
    pairs = []
    for index in range(args.pairs):
        pairs.append(one_pair(index, args))
        if args.json:
            with open(args.json, "a") as handle:
                handle.write(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), **pairs[-1]}) + "\n")
    walls = {name: [pair[name]["wall_s"] for pair in pairs] for name in pairs[0] if isinstance(pairs[0][name], dict)}
    print("\nmedian wall: " + ", ".join(f"{name} {statistics.median(values):.1f} s" for name, values in walls.items()))
    ratios = [pair["ratio"] for pair in pairs]
    print(f"median ratio suite / peer: {statistics.median(ratios):.2f}x "
          f"(pairs: {', '.join(f'{ratio:.2f}' for ratio in ratios)})")
    if args.numpy_module:
        print(f"median ratio numpy module / peer: {statistics.median(pair['numpy_ratio'] for pair in pairs):.3f}x")
    return 0 if all(pair["suite"]["exit"] == 0 for pair in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())

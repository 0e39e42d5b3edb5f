"""The default run, repeated: its wall time (min / median / max), cold and warm, and whether it stayed green.

    python benchmarks/default_run.py --runs 5                 # warm: the JAX compilation cache kept between runs
    python benchmarks/default_run.py --runs 3 --cold          # cold: an empty JAX compilation cache for each run
    python benchmarks/default_run.py --runs 20 --json runs.jsonl   # 20 fresh runs: the false-alarm count
    python benchmarks/default_run.py --runs 20 -- --impl builtin:torch_math   # ... with random draws (below)

Each run is the command README calls the default run, ``python -m pytest -p no:cacheprovider -q`` at the root of
this checkout (conformance/, every built-in, the plugin's ``-n auto``), made fresh:

* pytest's cache is off (``-p no:cacheprovider``: no ``--lf``/``--ff`` state);
* Hypothesis's example database is an empty temporary directory for each run (``HYPOTHESIS_STORAGE_DIRECTORY``),
  and the default profile is not derandomized, so every run draws its own examples;
* ``--cold``: JAX's persistent compilation cache is an empty temporary directory for each run
  (``--jax-compilation-cache DIR``), as on a CI runner without a cache; otherwise it is the checkout's default
  (``.attention-conformance/jax``, as pytest's cache is off), filled by a first, unreported run when it is empty.

A run that is not green (exit status other than 0) is a false alarm on the built-ins: its failing lines are printed.
The default run tours the built-ins on their covering corners (conformance/plugin.py), the same cases every run: for
a false-alarm count over random draws, name built-ins (``-- --impl builtin:NAME``) or pass a profile
(``-- --hypothesis-profile thorough``).
Wall time is measured around the subprocess (interpreter start and exit included), and so is the CPU time of the run's
processes (user + system of pytest and its workers), which varies less on a shared machine. Compare figures only
between runs on the same, otherwise idle machine.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfExX"]  # -rf: FAILED lines are read
OUTCOME = re.compile(r"(\d+) (passed|failed|skipped|errors?)")


def one_run(cold: bool, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="hypothesis-") as storage, \
            tempfile.TemporaryDirectory(prefix="jax-cache-") as jax_cache:
        # One token: pytest reads the value of "--opt VALUE" as a path when it decides the rootdir and -n early.
        command = COMMAND + ([f"--jax-compilation-cache={jax_cache}"] if cold else []) + extra
        env = dict(os.environ, HYPOTHESIS_STORAGE_DIRECTORY=storage)
        env.pop("JAX_COMPILATION_CACHE_DIR", None)  # it would win over the option
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU of the run's processes (pytest, its workers: each waited for by its parent), user + system: on a shared
    # machine it varies less than the wall time, so an A/B compares both.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = done.stdout + done.stderr
    last = [line for line in out.splitlines() if OUTCOME.search(line) and " in " in line]
    counts = {kind: int(n) for n, kind in OUTCOME.findall(last[-1])} if last else {}
    return {"exit": done.returncode, "wall_s": round(wall, 2), "cpu_s": round(cpu, 1), "counts": counts,
            "failures": [line for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))][:20],
            "tail": "" if done.returncode == 0 else out[-3000:]}


def spread(values: list[float]) -> str:
    return f"min {min(values):.1f} s, median {statistics.median(values):.1f} s, max {max(values):.1f} s"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", action="store_true", help="an empty JAX compilation cache for every run")
    parser.add_argument("--json", default=None, help="append every run's record here (JSON lines)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if not args.cold and not any((ROOT / ".attention-conformance" / "jax").glob("*")):
        print("warming the JAX compilation cache (one unreported run) ...", flush=True)
        one_run(False, args.pytest_args)
    runs = []
    for index in range(args.runs):
        record = one_run(args.cold, args.pytest_args)
        runs.append(record)
        print(f"run {index + 1}/{args.runs} ({'cold' if args.cold else 'warm'}): exit {record['exit']}, "
              f"{record['wall_s']:.1f} s ({record['cpu_s']:.1f} s of CPU), {record['counts']}", flush=True)
        for line in record["failures"]:
            print("    " + line, flush=True)
        if record["exit"] not in (0, 1):
            print(record["tail"], flush=True)
        if args.json:
            with open(args.json, "a") as handle:
                handle.write(json.dumps({**record, "cold": args.cold}) + "\n")
    green = sum(r["exit"] == 0 for r in runs)
    print(f"\n{'cold' if args.cold else 'warm'} default run, {len(runs)} runs: {spread([r['wall_s'] for r in runs])}; "
          f"CPU {spread([r['cpu_s'] for r in runs])}; green {green}/{len(runs)} (false alarms: {len(runs) - green})")
    return 0 if green == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())

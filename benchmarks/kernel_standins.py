"""How reliably the default run judges the CPU stand-ins for GPU kernels (zoo/kernel_*.py).

Runs the default command a user would type,

    python -m pytest conformance --impl zoo.<member> -p no:cacheprovider -q

N times per member (N = 20 by default), each time fresh, and prints per member how many runs
rejected it (exit 1) and how many accepted it (exit 0), the judged cases per run (passed +
failed + deviation, read off the terminal summary line "<name> 894 passed, 33 unsupported"),
the clauses the rejections named, and the wall time.

Fresh means no state carries from one run to the next:
* pytest's cache (``--lf``/``--ff`` data in .pytest_cache/) is off: ``-p no:cacheprovider``;
* Hypothesis's example database, which the dev profile keeps in ``.hypothesis/examples`` under
  the working directory and replays first (a failure found once would be found again without
  being drawn again), is pointed at an empty temporary directory for each run through
  ``HYPOTHESIS_STORAGE_DIRECTORY`` (hypothesis.configuration.storage_directory); the
  repository's own ``.hypothesis/`` is never read or written. The dev profile is not
  derandomized, so every run draws its own examples from a fresh random seed.

Usage: python benchmarks/kernel_standins.py [--runs 20] [--members kernel_correct ...] [--exitfirst] [--json PATH]
Each run takes 10-40 s on the 2-core machine (the default command's two xdist workers), so the
full 6 x 20 measurement takes about 30-60 minutes; run it in the background
(``nohup python benchmarks/kernel_standins.py > /tmp/kernel_standins.log 2>&1 &``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEMBERS = (
    "kernel_correct",
    "kernel_correct_tf32",
    "kernel_broken_nan_nonpositive_scale",
    "kernel_broken_fully_masked_rows",
    "kernel_broken_partial_tile_dropped",
    "kernel_broken_tf32_undeclared",
    "kernel_correct_pallas_region",
    "kernel_broken_causal_past_last_key_block",
    "kernel_broken_gqa_kv_head_from_query_head",
)
# The terminal summary's line per implementation: "zoo_x 903 cases judged (864 passed, 39 failed), 33 cases
# unsupported" (or, in older trees, "zoo_x 864 passed, 39 failed, 33 unsupported").
SUMMARY_LINE = re.compile(r"^(?P<name>zoo_\S+)\s+(?P<counts>\d+ (?:cases judged|passed|failed|deviation|unsupported).*)$",
                          re.M)
BREAKS_LINE = re.compile(r"^zoo_\S+ breaks: (?P<clauses>.+)$", re.M)


def one_run(member: str, exitfirst: bool = False) -> dict:
    command = [sys.executable, "-m", "pytest", "conformance", "--impl", f"zoo.{member}", "-p", "no:cacheprovider", "-q",
               "-rfExX"]  # -rf: the FAILED lines are read below
    if exitfirst:
        command.append("-x")
    with tempfile.TemporaryDirectory(prefix="hypothesis-") as storage:
        # PYTHONPATH: this checkout's suite and zoo, also in the xdist workers (not an editable install's)
        env = dict(os.environ, HYPOTHESIS_STORAGE_DIRECTORY=storage,
                   PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        start = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    out = done.stdout + done.stderr
    counts = Counter()
    found = SUMMARY_LINE.search(out)
    if found:
        for number, status in re.findall(r"(\d+) (?:cases )?(passed|failed|deviation|unsupported)", found["counts"]):
            counts[status] = int(number)
    breaks = BREAKS_LINE.search(out)
    # Under xdist, -x ends the run as interrupted (exit 2): a run stopped at its first failure is a rejection.
    exit_code = 1 if exitfirst and done.returncode == 2 and "\nFAILED " in out else done.returncode
    return {
        "member": member,
        "exit": exit_code,
        "wall_s": round(wall, 2),
        "judged": counts["passed"] + counts["failed"] + counts["deviation"],
        "counts": dict(counts),
        "clauses": breaks["clauses"].split(", ") if breaks else [],
        "tail": "" if exit_code in (0, 1) else out[-2000:],
    }


def summarise(member: str, runs: list[dict]) -> str:
    n = len(runs)
    rejected = sum(r["exit"] == 1 for r in runs)
    accepted = sum(r["exit"] == 0 for r in runs)
    other = Counter(r["exit"] for r in runs if r["exit"] not in (0, 1))
    judged = [r["judged"] for r in runs]
    walls = [r["wall_s"] for r in runs]
    clauses = Counter(c for r in runs for c in r["clauses"])
    lines = [
        f"{member}: rejected {rejected}/{n}, accepted {accepted}/{n}"
        + (f", other exit codes {dict(other)}" if other else ""),
        f"    judged cases per run: min {min(judged)}, median {statistics.median(judged):g}, max {max(judged)}",
        f"    wall per run: min {min(walls):.1f} s, median {statistics.median(walls):.1f} s, max {max(walls):.1f} s;"
        f" total {sum(walls):.0f} s",
    ]
    if clauses:
        lines.append("    rejections named (runs): " + ", ".join(f"{c} {k}" for c, k in clauses.most_common()))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--members", nargs="+", default=list(MEMBERS))
    parser.add_argument("--exitfirst", action="store_true",
                        help="stop each run at its first failure (-x): a rejection rate in less time; the judged "
                             "counts are then of the run up to it")
    parser.add_argument("--json", default=None, help="write every run's record here (JSON lines, appended as they finish)")
    args = parser.parse_args(argv)
    summaries = []
    for member in args.members:
        runs = []
        for index in range(args.runs):
            record = one_run(member, args.exitfirst)
            runs.append(record)
            print(f"{member} run {index + 1}/{args.runs}: exit {record['exit']}, judged {record['judged']}, "
                  f"{record['wall_s']:.1f} s" + (f", breaks {', '.join(record['clauses'])}" if record["clauses"] else ""),
                  flush=True)
            if record["tail"]:
                print(record["tail"], flush=True)
            if args.json:
                with open(args.json, "a") as handle:
                    handle.write(json.dumps(record) + "\n")
        summaries.append(summarise(member, runs))
        print(summaries[-1], flush=True)
    print("\n=== summary ===")
    print("\n".join(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main())

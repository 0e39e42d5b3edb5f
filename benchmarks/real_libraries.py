"""What the suite finds in real libraries: each adapter of examples/ run alone through the default suite.

    python -m pip install torch==2.13.0 -e ".[all,examples]"     # once (README, "Real libraries")
    python benchmarks/real_libraries.py                          # every adapter whose library is installed
    python benchmarks/real_libraries.py --only keras_attention -n 2

For each adapter it runs ``python -m pytest conformance --impl examples.NAME -p no:cacheprovider -n N
--hypothesis-seed=0 --conformance-report DIR/NAME.json`` from the repository root (the seed makes the draws, and so
the counts, repeatable; one run at a time: the machine's cores go to its workers) and prints one Markdown row from
the report: the library and its version, the cases judged, passed /
failed / deviations, the clauses of the failed cases, the deviations' clauses, the summary's root causes, and the
run's wall and CPU seconds (the pytest process and its workers; wall time depends on the machine's load, CPU time
much less). An adapter whose library is not installed is a row saying so, never a run. Exit status 0 when every run
ended with a verdict (pytest's 0 or 1: a library's real bugs fail its run on purpose), 1 otherwise.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# adapter module in examples/, the distribution whose version the row names, the module that must import
ADAPTERS = (
    ("keras_attention", "keras", "keras"),
    ("flax_attention", "flax", "flax"),
    ("hf_eager_attention", "transformers", "transformers"),
    ("hf_sdpa_attention", "transformers", "transformers"),
    ("pallas_flash_interpret", "jax", "jax.experimental.pallas"),
    ("fla_parallel_attn_interpret", "fla-core", "fla.ops.attn.parallel"),
    ("liger_softmax_interpret", "liger-kernel", "liger_kernel.ops.softmax"),
    ("liger_neighborhood_attention_interpret", "liger-kernel", "liger_kernel.ops.fused_neighborhood_attention"),
)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_adapter(name: str, workers: str, seed: str, report_dir: Path, extra: list[str]) -> dict:
    report = report_dir / f"{name}.json"
    command = [sys.executable, "-m", "pytest", "conformance", "--impl", f"examples.{name}", "-p", "no:cacheprovider",
               "-n", workers, "-q", f"--hypothesis-seed={seed}", "--conformance-report", str(report), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cpu, start = _cpu_seconds(), time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
    if not report.exists():
        return {"name": name, "error": f"pytest exited {done.returncode} without a report: "
                                       f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}"}
    data = json.loads(report.read_text())
    impl = f"examples_{name}"
    summary = data["summary"].get(impl, {})
    cases = [case for case in data["cases"] if case["implementation"] == impl]
    return {
        "name": name, "exit": done.returncode, "wall": wall, "cpu": cpu,
        "judged": summary.get("judged", 0), "passed": summary.get("passed", 0), "failed": summary.get("failed", 0),
        "deviation": summary.get("deviation", 0), "unsupported": summary.get("unsupported", 0),
        "broken": sorted({case["clause"] for case in cases if case["status"] == "failed"}),
        "declared": sorted({case["clause"] for case in cases if case["status"] == "deviation"}),
        "causes": [f"{cause['cause']} ({cause['failures']})" for cause in data.get("causes", [])
                   if cause["implementation"] == impl],
    }


def row(name: str, dist: str, result: dict | None) -> str:
    version = importlib.metadata.version(dist) if result is not None else "-"
    if result is None:
        return f"| `{name}` | {dist} (not installed) | - | - | - | - | - | - |"
    if "error" in result:
        return f"| `{name}` | {dist} {version} | error: {result['error']} | - | - | - | - | - |"
    counts = f"{result['passed']} / {result['failed']} / {result['deviation']}"
    return (f"| `{name}` | {dist} {version} | {result['judged']} ({result['unsupported']} unsupported) | {counts} | "
            f"{', '.join(result['broken']) or '-'} | {', '.join(result['declared']) or '-'} | "
            f"{'; '.join(result['causes']) or '-'} | {result['wall']:.0f} ({result['cpu']:.0f}) |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=[name for name, _, _ in ADAPTERS],
                        help="run this adapter only (repeatable)")
    parser.add_argument("-n", default="2", help="pytest-xdist workers per run (default 2)")
    parser.add_argument("--seed", default="0", help="Hypothesis seed (default 0: the README table's draws)")
    parser.add_argument("--report-dir", type=Path, help="where the JSON reports go (default: a temporary directory)")
    args, extra = parser.parse_known_args(argv)
    report_dir = args.report_dir or Path(tempfile.mkdtemp(prefix="real-libraries-"))
    report_dir.mkdir(parents=True, exist_ok=True)
    print(f"python {sys.version.split()[0]}; " + ", ".join(
        f"{dist} {importlib.metadata.version(dist)}" for dist in ("numpy", "torch", "jax") if _installed(dist)))
    print("| adapter | library | cases judged | passed / failed / deviations | clauses failed | clauses declared "
          "(deviations) | root causes (failures) | wall s (CPU s) |")
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for name, dist, module in ADAPTERS:
        if args.only and name not in args.only:
            continue
        result = run_adapter(name, args.n, args.seed, report_dir, extra) if _installed(module) else None
        ok &= result is None or result.get("exit") in (0, 1)
        print(row(name, dist, result), flush=True)
    print(f"reports: {report_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

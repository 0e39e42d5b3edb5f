"""A pytest plugin for the benchmark: how many XLA compiles a run makes, and their cost.

    JAX_COMPILE_LOG=/tmp/compiles.txt PYTHONPATH=benchmarks pytest -p jax_compile_log

Each process that runs tests (every xdist worker, or the one process under -n 0)
appends one line at the end of its session: its name, the number of XLA backend
compiles, their summed seconds, and the seconds spent tracing and lowering to
MLIR. The xdist controller runs no test, so it does not import JAX for this.
"""
from __future__ import annotations

import collections
import os
from pathlib import Path

EVENTS = {
    "/jax/core/compile/backend_compile_duration": "compile",
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
}
seconds: collections.Counter = collections.Counter()
counts: collections.Counter = collections.Counter()


def _runs_tests(config) -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) or not getattr(config.option, "numprocesses", None)


def pytest_configure(config):
    if not (os.environ.get("JAX_COMPILE_LOG") and _runs_tests(config)):
        return
    try:
        import jax.monitoring
    except ImportError:
        return

    def listen(event: str, duration: float, **_):
        if event in EVENTS:
            seconds[EVENTS[event]] += duration
            counts[EVENTS[event]] += 1

    jax.monitoring.register_event_duration_secs_listener(listen)


def pytest_sessionfinish(session):
    path = os.environ.get("JAX_COMPILE_LOG")
    if path and _runs_tests(session.config):
        with open(path, "a") as log:
            log.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {counts['compile']} {seconds['compile']:.2f} "
                      f"{seconds['trace'] + seconds['lower']:.2f}\n")


def summary(path: str) -> str:
    """One line from the log: compiles and seconds, in all and per process."""
    rows = [line.split() for line in Path(path).read_text().splitlines() if line.strip()]
    compiles = sum(int(r[1]) for r in rows)
    backend = sum(float(r[2]) for r in rows)
    front = sum(float(r[3]) for r in rows)
    each = ", ".join(f"{r[0]}: {r[1]} in {float(r[2]):.1f} s" for r in sorted(rows))
    return (f"{compiles} XLA compiles, {backend:.1f} s of backend compile and {front:.1f} s of tracing and "
            f"lowering, summed over processes ({each})")

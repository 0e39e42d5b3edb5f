"""How fast is the suite? Prints the figures README's "Speed" table quotes.

    python benchmarks/suite_speed.py            # everything (about 10 minutes on 2 cores)
    python benchmarks/suite_speed.py --quick    # skip the whole-suite runs

Figures:
  default run      wall time of `pytest` at the root (conformance/; the plugin gives
                   -n auto) with JAX's compilation cache cold (with its XLA
                   compiles counted by benchmarks/jax_compile_log.py) and then warm, of
                   `pytest -n 0` (one process), of the self-checks `pytest tests`
                   and both together, and of `pytest conformance --impl
                   examples.my_attention` (one plain NumPy module)
  per impl         examples per second of each built-in under the conformance
                   tests, and the harness overhead: the suite's time for that
                   implementation divided by the time spent inside the
                   implementation's calls on the very same inputs, with the time
                   in the float64 oracle and error bound shown apart
  profiles         one test module under dev / ci / thorough: time against examples
  JAX compiles     XLA compiles per distinct input signature and their cost

Each whole-suite figure is one run on an otherwise idle machine; rerun to see the
spread (about ±10 % on the 2-core CI machine).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def wall(command: list[str], env: dict | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    tail = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    return seconds, f"exit {done.returncode}: {tail}"


JAX_CACHE = ROOT / ".pytest_cache" / "d" / "attention-conformance" / "jax"  # --jax-compilation-cache auto


def whole_suite_figures() -> None:
    pytest = [sys.executable, "-m", "pytest", "-q"]
    shutil.rmtree(JAX_CACHE, ignore_errors=True)
    compile_log = Path(tempfile.mkdtemp()) / "compiles.txt"
    counting = {"JAX_COMPILE_LOG": str(compile_log),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH")]))}
    seconds, tail = wall(pytest + ["-p", "jax_compile_log"], env=counting)
    print(f"{'default run `pytest` (conformance/, -n auto), cold JAX cache':<62} {seconds:7.1f} s   {tail}")
    if compile_log.exists():
        from jax_compile_log import summary

        print(f"{'  of which':<62} {summary(str(compile_log))}")
    for label, extra in (
        ("default run again, warm JAX cache", []),
        ("one process (`pytest -n 0`), warm JAX cache", ["-n", "0"]),
        ("self-checks (`pytest tests`)", ["tests"]),
        ("both (`pytest conformance tests`, CI's paths, dev profile)", ["conformance", "tests"]),
        ("one NumPy module (`--impl examples.my_attention -n 0`)", ["conformance", "--impl", "examples.my_attention",
                                                                    "-n", "0"]),
        ("one NumPy module under -n auto", ["conformance", "--impl", "examples.my_attention"]),
    ):
        seconds, tail = wall(pytest + extra)
        print(f"{label:<62} {seconds:7.1f} s   {tail}")


class CallTimer:
    """A pytest plugin: time inside Implementation.call, and per test item, grouped by implementation."""

    def __init__(self):
        self.inside = collections.Counter()  # impl -> seconds inside its calls
        self.calls = collections.Counter()  # impl -> number of calls (examples that reached the implementation)
        self.suite = collections.Counter()  # impl -> seconds of its test items (setup + call + teardown)
        self.judging = collections.Counter()  # impl -> seconds in the float64 oracle and the error bound

    def install(self):
        from attention_conformance.conformance.judging.verdict import Judge
        from attention_conformance.implementations.registry import Implementation

        Implementation.call = self._timed(Implementation.call, self.inside, count=True)
        for method in ("_expected_shape", "_fully_masked_rows", "_oracle"):
            setattr(Judge, method, self._timed(getattr(Judge, method), self.judging))

    def _timed(self, method, seconds: collections.Counter, count: bool = False):
        """``method`` adding its time to ``seconds`` under the implementation's name (self is an
        Implementation or a Judge)."""
        calls = self.calls

        def timed(owner, *args, **kwargs):
            name = getattr(owner, "impl", owner).name
            start = time.perf_counter()
            try:
                return method(owner, *args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - start
                calls[name] += count

        return timed

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        start = time.perf_counter()
        yield
        impl = getattr(getattr(item, "callspec", None), "params", {}).get("impl")
        if impl is not None:
            self.suite[impl.name] += time.perf_counter() - start


def per_implementation_figures(profile: str) -> None:
    timer = CallTimer()
    timer.install()
    with contextlib.redirect_stdout(io.StringIO()):  # the figures below are the output, not pytest's
        pytest.main(["conformance", "-q", "-n", "0", "--hypothesis-profile", profile, "--device", "cpu"],
                    plugins=[timer])
    print(f"\nper implementation, conformance/ on CPU, profile {profile}:")
    print("  inside: in the implementation's calls; oracle: the float64 oracle and the error bound;")
    print("  rest: Hypothesis's engine, case generation, array conversion, pytest")
    print(f"{'implementation':<16}{'calls':>8}{'suite s':>10}{'inside s':>10}{'oracle s':>10}{'rest s':>8}"
          f"{'examples/s':>12}{'overhead':>10}")
    for name in sorted(timer.suite):
        suite, inside, calls, judging = timer.suite[name], timer.inside[name], timer.calls[name], timer.judging[name]
        print(f"{name:<16}{calls:>8}{suite:>10.1f}{inside:>10.1f}{judging:>10.1f}{suite - inside - judging:>8.1f}"
              f"{calls / suite:>12.0f}{suite / inside if inside else float('nan'):>9.1f}x")


def profile_scaling() -> None:
    print("\nprofiles, conformance/test_properties.py on numpy_native:")
    for profile in ("dev", "ci", "thorough"):
        seconds, tail = wall([sys.executable, "-m", "pytest", "-q", "-n", "0", "conformance/test_properties.py",
                              "-k", "numpy_native", "--hypothesis-profile", profile])
        print(f"  {profile:<9} {seconds:7.1f} s   {tail}")


def jax_compile_figures() -> None:
    import numpy as np

    try:
        import jax.monitoring
        import jax.numpy as jnp
    except ImportError:
        print("\nJAX is not installed: no compile figures")
        return
    from attention_conformance.implementations import builtin

    compiles = []

    def count(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(count)
    rng = np.random.default_rng(0)
    shapes = [(1, 1, 3, 4), (1, 2, 5, 3), (2, 2, 7, 6), (1, 1, 2, 2), (2, 1, 4, 4), (1, 3, 6, 2)]
    print("\nJAX: first call (trace + XLA compile) against a repeat call, jax_numpy sdpa, float32:")
    first, again = [], []
    for shape in shapes:
        q = jnp.asarray(rng.standard_normal(shape), jnp.float32)
        start = time.perf_counter()
        builtin.JaxNumpy.sdpa(q, q, q, scale=0.5).block_until_ready()
        first.append(time.perf_counter() - start)
        start = time.perf_counter()
        builtin.JaxNumpy.sdpa(q, q, q, scale=-0.3).block_until_ready()  # a new scale value: no recompile
        again.append(time.perf_counter() - start)
    print(f"  {len(shapes)} distinct shapes -> {len(compiles)} XLA compiles ({sum(compiles):.2f} s; jax_numpy pads "
          f"shapes to buckets); first call {np.median(first) * 1e3:.0f} ms (median), repeat call with a new scale "
          f"{np.median(again) * 1e3:.2f} ms")
    print(f"  the built-ins' CPU compiler options: {builtin.cpu_compiler_options()} (None: XLA's defaults)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the whole-suite wall-clock runs")
    parser.add_argument("--profile", default="dev", help="Hypothesis profile of the per-implementation figures")
    options = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    if not options.quick:
        whole_suite_figures()
        profile_scaling()
    jax_compile_figures()
    per_implementation_figures(options.profile)


if __name__ == "__main__":
    main()

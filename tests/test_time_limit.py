"""The per-test time limit holds inside Hypothesis (conformance/time_limit.py).

pytest-timeout's "signal" method raises pytest's Failed, which Hypothesis takes for a failing example: it shrank
and replayed past the limit with no timer left (a failing property went on for 3.2x its `--timeout 3` here;
single failing JAX tests took 170-193 s against 120 s), or called the slow example flaky. In the suite's runs the
limit raises an exception Hypothesis lets through. Each run below is a few seconds.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from attention_conformance.conformance.specdata import ROOT

pytestmark = pytest.mark.selfcheck

SLACK_S = 1.5  # what the call may take past the limit (the signal lands between two bytecodes of the main thread)


def run(*args: str, delay: str = "0.2") -> tuple[subprocess.CompletedProcess, float]:
    environment = {**os.environ, "SLOW_ATTENTION_DELAY_S": delay}
    for variable in ("PYTEST_XDIST_WORKER", "ATTENTION_CONFORMANCE_IMPL", "PYTEST_ADDOPTS"):
        environment.pop(variable, None)
    command = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-p",
               "attention_conformance.pytest_plugin", "-q", "--durations=1", "--durations-min=0",
               "-W", "ignore::DeprecationWarning", "--impl", "tests.slow_attention", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=environment)
    durations = [float(s) for s in re.findall(r"^(\d+\.\d+)s call ", done.stdout, flags=re.M)]
    assert durations, done.stdout[-3000:] + done.stderr[-2000:]
    return done, max(durations)


def test_a_slow_failing_property_stops_at_the_limit_instead_of_shrinking_past_it(tmp_path):
    """Hypothesis finds a failure, shrinks it at 0.2 s an example, and meets the limit while shrinking."""
    test_file = tmp_path / "test_slow_property.py"
    test_file.write_text(textwrap.dedent("""
        import time
        from hypothesis import given, settings, strategies as st

        @settings(max_examples=1000, deadline=None, database=None)
        @given(st.integers(0, 10**9))
        def test_slow_and_failing(x):
            time.sleep(0.2)
            assert x < 1000
    """))
    done, seconds = run(str(test_file), "--timeout", "3")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "TimeLimitExceeded: Timeout: the test ran past the per-test time limit of 3 s" in done.stdout
    assert seconds < 3 + SLACK_S, f"{seconds:.2f} s against a limit of 3 s"


def test_a_property_of_the_suite_timed_out_in_its_random_examples_is_not_called_flaky():
    """A correct but slow sdpa (0.4 s a call): the limit falls among Hypothesis's random examples. pytest-timeout's
    Failed there had Hypothesis replay the example, which then passed: a FlakyFailure, past the limit."""
    done, seconds = run("conformance/test_properties.py", "-k", "test_default_scale", "--dtype", "float64",
                        "--hypothesis-profile", "thorough", "--timeout", "6", delay="0.4")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "the test ran past the per-test time limit of 6 s" in done.stdout
    assert "Flaky" not in done.stdout and "Failed to reproduce" not in done.stdout
    assert seconds < 6 + SLACK_S, f"{seconds:.2f} s against a limit of 6 s"


def test_the_limit_names_the_call_it_interrupted():
    """On an H200 the limit stopped two torch_flex tests inside a compile: its message named neither the case nor the
    implementation. Now it names the call the test was waiting for, and nothing once that call returned."""
    import time

    from attention_conformance.conformance.judging import time_limit

    time_limit.waiting_for(("torch_flex", "B1 Hq2/Hkv2 Lq65 Lk65 Dk256 Dv256 mask=bool-full", time.monotonic() - 85.0))
    try:
        text = time_limit.message(120)
    finally:
        time_limit.waiting_for(None)
    assert "It was waiting 85." in text and "for a call of torch_flex on case B1 Hq2/Hkv2 Lq65 Lk65 Dk256" in text
    assert "waiting" not in time_limit.message(120)

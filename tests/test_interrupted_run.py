"""A run stopped from outside still reports what it judged (conformance/session.py, conformance/transport.py).

`timeout 900 pytest ...` used to print progress dots and nothing else: no summary, no report. Here the run of a
slow stand-in (tests/slow_attention.py, 0.05 s a call) gets SIGTERM once a few tests have passed, in one process
and under two xdist workers; it must print the conformance summary marked INCOMPLETE, write the report marked
``"complete": false`` with every case of the tests it reported passed, and exit 2 (pytest's "interrupted").
About 10 s in one process, 20 s under -n 2.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import jsonschema
import pytest

from attention_conformance.conformance.specdata import ROOT

pytestmark = pytest.mark.selfcheck

SCHEMA = json.loads((ROOT / "docs" / "report-schema.json").read_text())
PASSED = re.compile(r"(?:(\S+::\S+) PASSED|PASSED (\S+::\S+))")


def run_and_interrupt(report, *options: str, passed_before: int = 3, limit_s: float = 90):
    """Start the run, SIGTERM it once ``passed_before`` tests passed; returns (exit code, output, seconds from
    the signal to the exit)."""
    environment = {**os.environ, "SLOW_ATTENTION_DELAY_S": "0.05"}
    for variable in ("PYTEST_XDIST_WORKER", "ATTENTION_CONFORMANCE_IMPL", "PYTEST_ADDOPTS"):
        environment.pop(variable, None)
    command = [sys.executable, "-m", "pytest", "conformance", "-v", "-p", "no:cacheprovider", "--impl",
               "tests.slow_attention", "--dtype", "float64", "--hypothesis-profile", "dev",
               "-W", "ignore::DeprecationWarning", "--conformance-report", str(report), *options]
    process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    reader.start()
    started = time.monotonic()
    while len(PASSED.findall("".join(output))) < passed_before:
        assert process.poll() is None, "the run ended before it was interrupted:\n" + "".join(output)[-3000:]
        assert time.monotonic() - started < limit_s, "no test passed in time:\n" + "".join(output)[-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(10)
    return code, "".join(output), time.monotonic() - signalled


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"]], ids=["one-process", "two-workers"])
def test_a_run_stopped_by_sigterm_prints_its_summary_and_writes_what_it_judged(tmp_path, workers):
    report_path = tmp_path / "R.json"
    code, out, after_signal = run_and_interrupt(report_path, *workers)
    assert code == 2, out[-3000:]  # pytest's "interrupted"
    assert after_signal < 30, f"{after_signal:.1f} s from SIGTERM to exit"
    assert "attention conformance" in out and "INCOMPLETE: interrupted by SIGTERM" in out, out[-3000:]
    assert re.search(r"tests_slow_attention +\d+ cases judged \(\d+ passed, 0 failed\)", out), out[-3000:]

    report = json.loads(report_path.read_text())
    jsonschema.validate(report, SCHEMA)
    assert report["complete"] is False and report["incomplete_reason"].startswith("interrupted by SIGTERM")
    assert report["exit_status"] == 2 and report["coverage"] == []  # a partial run is not held to the rule
    summary = report["summary"]["tests_slow_attention"]
    assert summary["judged"] == summary["passed"] > 0 and summary["cases"] == len(report["cases"])
    assert (tmp_path / "R.html").exists()
    # Every test the terminal reported passed left its cases in the report (under xdist: from the workers'
    # streams or their final output, whichever reached the controller).
    judged_tests = {case["test"] for case in report["cases"]}
    passed = {a or b for a, b in PASSED.findall(out)}
    assert len(passed) >= 3
    without_cases = [test for test in passed if "test_fixture" in test or "test_properties" in test
                     if recorded_as(test) not in judged_tests]
    assert not without_cases, without_cases


def recorded_as(nodeid: str) -> str:
    """The test name a passed test's records carry: its node id; test_fixture[ID] for a fixture (its judge names
    the fixture, not the implementation, device and dtype)."""
    if "::test_fixture[" in nodeid:
        fixture = nodeid.split("::test_fixture[", 1)[1].removesuffix("-tests_slow_attention-cpu-float64]")
        return f"test_fixture[{fixture}]"
    return nodeid

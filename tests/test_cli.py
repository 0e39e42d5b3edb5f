"""End to end, as a user runs it: `pytest --impl MODULE` in a subprocess from the repository root."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from attention_conformance.conformance.specdata import ROOT

pytestmark = pytest.mark.selfcheck


def pytest_run(*args, env=None, timeout=300):
    environment = {**os.environ, **(env or {})}
    environment.pop("PYTEST_XDIST_WORKER", None)
    paths = [a for a in args if a.startswith("conformance")] or ["conformance"]
    options = [a for a in args if not a.startswith("conformance")]
    command = [sys.executable, "-m", "pytest", *paths, "-q", "-n", "0", "-p", "no:cacheprovider",
               "--hypothesis-profile", "dev", "-W", "ignore::DeprecationWarning", *options]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=environment)


def test_a_plain_numpy_sdpa_module_passes():
    done = pytest_run("--impl", "examples.my_attention")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "passed" in done.stdout and "failed" not in done.stdout.splitlines()[-1]
    # Operations the module does not expose are skipped (counted by reason in the summary), never failed.
    assert any("not implemented (operations not exposed):" in line and "examples_my_attention" in line
               and "softmax" in line for line in done.stdout.splitlines()), done.stdout[-3000:]
    assert not any("not implemented" in line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR")))
    # The 8-bit tests, which no implementation of this run can take, say so (pytest's own words named no cause).
    assert "got empty parameter set" not in done.stdout
    assert any("no implementation of this run declares an 8-bit dtype" in line for line in done.stdout.splitlines())


def test_a_wrong_axis_softmax_is_rejected_naming_the_clause():
    done = pytest_run("--impl", "examples.wrong_axis_softmax")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "[softmax.last-axis]" in done.stdout or "[softmax.definition]" in done.stdout
    assert "repro: attention-conformance repro " in done.stdout


def one_load_error(spec: str, mentioning: str) -> str:
    """Run --impl SPEC, expect exit 4 and no traceback; return the one line that mentions ``mentioning``."""
    done = pytest_run("--impl", spec)
    assert done.returncode == 4, done.stdout[-2000:]
    assert "Traceback" not in done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if mentioning in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_an_unimportable_impl_is_one_clear_error():
    assert "cannot import module" in one_load_error("no_such_module_anywhere", "no_such_module_anywhere")


def test_a_malformed_fixture_stops_the_run_naming_the_file(tmp_path):
    (tmp_path / "broken.yaml").write_text(textwrap.dedent("""
        document: 003_58636e0047490b73.txt
        title: broken
        fixtures:
          - id: no-inputs
            kind: example
            op: softmax
            clauses: [softmax.definition]
            source: here
    """))
    done = pytest_run("--impl", "examples.my_attention", env={"ATTENTION_CONFORMANCE_FIXTURES": str(tmp_path)})
    assert done.returncode == 4
    assert "broken.yaml: entry 'no-inputs'" in done.stdout + done.stderr


def test_a_hanging_implementation_is_cut_by_the_call_time_limit_and_the_run_goes_on():
    done = pytest_run("conformance/test_fixtures.py", "--impl", "examples.hanging_attention",
                      "-k", "qkv-output or qkv-softscores-sdpa", "--dtype", "float64",
                      env={"ATTENTION_CONFORMANCE_CALL_TIMEOUT": "1"})
    assert done.returncode == 1
    assert "2 failed" in done.stdout  # both cases ran: the first hang did not end the session
    assert "the call hung: no result within 1 s (timed out" in done.stdout
    assert "hung earlier on case qkv-" in done.stdout  # the second fails at once, naming the first


@pytest.mark.parametrize("impl, workers", [("examples.hanging_attention", "2"), ("examples.hanging_when_lq3", "0")])
def test_a_hang_in_fixtures_and_properties_ends_the_run_quickly(impl, workers):
    """Every test of fixtures and properties: the hang costs one call time limit per process, then
    every case fails at once (no property shrinks into it)."""
    started = time.monotonic()
    # --tb=short: the whole verdict (its shapes line) rather than the failure block
    done = pytest_run("conformance/test_fixtures.py", "conformance/test_properties.py", "--impl", impl,
                      "--dtype", "float64", "-n", workers, "--tb=short", env={"ATTENTION_CONFORMANCE_CALL_TIMEOUT": "2"})
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stdout[-3000:]
    assert "the call hung: no result within 2 s (timed out" in done.stdout
    assert "hung earlier on case" in done.stdout
    assert elapsed < 100, f"{elapsed:.0f} s"
    if impl.endswith("lq3"):  # the case that hung is one with Lq == 3 (its shapes line names q)
        shapes = done.stdout.split("problem  the call hung")[0].rsplit("shapes", 1)[1].splitlines()[0]
        assert re.search(r"q\(\d+, \d+, 3, \d+\)", shapes), shapes


def test_a_class_whose_constructor_needs_arguments_is_one_load_error():
    line = one_load_error("examples.needs_arguments:Attention", "needs_arguments")
    assert "cannot instantiate class Attention" in line and "pass an instance" in line


def test_a_fixture_the_oracle_does_not_bear_out_stops_the_run_under_impl(tmp_path):
    """Checked when the fixtures load, --impl included (the self-checks step aside under --impl)."""
    (tmp_path / "wrong.yaml").write_text(textwrap.dedent("""
        document: 003_58636e0047490b73.txt
        title: wrong
        fixtures:
          - id: wrong-halves
            kind: example
            op: softmax
            clauses: [softmax.definition]
            source: here
            inputs: {x: [[0.0, 0.0]]}
            expected: [[0.5, 0.6]]
            tolerance: {atol: 1.0e-6, reason: "exact halves"}
    """))
    (tmp_path / "empty.yaml").write_text("")
    done = pytest_run("--impl", "examples.my_attention", env={"ATTENTION_CONFORMANCE_FIXTURES": str(tmp_path)})
    assert done.returncode == 4
    out = done.stdout + done.stderr
    assert "wrong.yaml: entry 'wrong-halves': field 'expected': the oracle does not reproduce the printed values" in out
    assert "empty.yaml: file is empty" in out
    assert "passed" not in out and "failed" not in out  # no implementation was judged


def test_raise_wrong_shape_wrong_dtype_and_nan_each_fail_their_own_case():
    done = pytest_run("conformance/test_fixtures.py", "conformance/test_properties.py", "--impl",
                      "examples.shape_and_nan_attention", "--dtype", "float32", "-k",
                      "test_fixture or test_causal_top_left or test_explicit_scale or test_bool_mask")
    out = done.stdout
    assert done.returncode == 1
    assert "the implementation raised RuntimeError: masks are not handled" in out
    assert "[sdpa.output-shape]" in out and "output shape" in out
    assert "[sdpa.output-dtype]" in out and "output dtype float64, expected float32" in out
    assert "[sdpa.finite]" in out or "[softmax.large-inputs]" in out


def test_an_option_value_after_a_space_that_would_move_the_rootdir_is_a_usage_error(tmp_path):
    """pytest chooses the rootdir before any plugin's options are known, so a bare `pytest --jax-compilation-cache
    /elsewhere` takes /elsewhere for a test path: the rootdir, the ini file and the suite would be lost."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only"]
    done = subprocess.run([*command, "--jax-compilation-cache", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"write --jax-compilation-cache={tmp_path}" in done.stderr
    done = subprocess.run([*command, f"--jax-compilation-cache={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "tests collected" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    inside = ROOT / "conformance"  # a value inside the checkout leaves the rootdir where it was
    done = subprocess.run([*command, "--jax-compilation-cache", str(inside), "-k", "nothing_at_all"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-2000:]

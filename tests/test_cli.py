"""End to end, as a user runs it: `pytest --impl MODULE` in a subprocess from the repository root."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conformance.specdata import ROOT

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
    assert "passed" in done.stdout and "not implemented" not in done.stdout.split("short test summary")[0][-200:]


def test_a_wrong_axis_softmax_is_rejected_naming_the_clause():
    done = pytest_run("--impl", "examples.wrong_axis_softmax")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "[softmax.last-axis]" in done.stdout or "[softmax.definition]" in done.stdout
    assert "repro (run from the repository root)" in done.stdout


def test_an_unimportable_impl_is_one_clear_error():
    done = pytest_run("--impl", "no_such_module_anywhere")
    assert done.returncode == 4
    errors = [line for line in (done.stdout + done.stderr).splitlines() if "no_such_module_anywhere" in line]
    assert errors and "cannot import module" in errors[0]
    assert "Traceback" not in done.stderr


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


def test_a_hanging_implementation_is_cut_by_the_timeout_and_the_run_goes_on():
    done = pytest_run("conformance/test_fixtures.py", "--impl", "examples.hanging_attention", "--timeout", "1",
                      "-k", "qkv-output or qkv-softscores-sdpa", "--dtype", "float64")
    assert done.returncode == 1
    assert "Timeout" in done.stdout
    assert "2 failed" in done.stdout  # both cases ran: the first hang did not end the session


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

"""The pytest plugin's registration and defaults in a source checkout, the GitHub Actions example, and
missing spec data (the installed wheel itself: tests/test_wheel_install.py)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import yaml

from attention_conformance.conformance.specdata import ROOT, SpecError, clauses, fixtures

pytestmark = pytest.mark.selfcheck

WORKFLOW = ROOT / "docs" / "github-actions" / "attention-conformance.yml"
OPTION = "--impl=MODULE[:ATTR]"


def run(*args: str, **extra: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, **extra}
    for variable in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "ATTENTION_CONFORMANCE_IMPL"):
        environment.pop(variable, None)
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=environment)


def test_the_checkout_registers_the_plugin_once():
    """The entry point (editable install) and conftest.py name the same module: one set of options."""
    done = run("-m", "pytest", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(OPTION) == 1


def test_without_the_entry_point_conftest_registers_it():
    """A checkout used through PYTHONPATH alone: no entry points load, conftest.py registers the plugin."""
    done = run("-m", "pytest", "conformance/test_fixtures.py", "--impl", "examples.my_attention", "-q",
               "-p", "no:cacheprovider", "-p", "_hypothesis_pytestplugin", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "examples_my_attention" in done.stdout and "workers" not in done.stdout


def test_xdist_can_be_left_out():
    """`-n auto` is the plugin's default, not an addopts entry: `-p no:xdist` runs in one process."""
    done = run("-m", "pytest", "conformance/test_fixtures.py", "--impl", "examples.my_attention", "-q",
               "-p", "no:cacheprovider", "-p", "no:xdist")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "passed" in done.stdout and "workers" not in done.stdout


def test_missing_spec_data_is_a_loud_error(tmp_path):
    with pytest.raises(SpecError, match=f"no clauses.*yaml in {tmp_path}"):
        clauses(tmp_path)
    with pytest.raises(SpecError, match=f"no .*yaml fixture file in {tmp_path}"):
        fixtures(tmp_path)


def test_the_github_actions_example_runs_the_documented_command(tmp_path):
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert set(workflow["jobs"]) == {"cpu", "gpu"}
    cpu, gpu = workflow["jobs"]["cpu"], workflow["jobs"]["gpu"]
    assert cpu["runs-on"] == "ubuntu-latest" and "self-hosted" in gpu["runs-on"]
    commands = {}
    for name, job in (("cpu", cpu), ("gpu", gpu)):
        runs = [step["run"] for step in job["steps"] if "attention-conformance --impl" in step.get("run", "")]
        assert len(runs) == 1, name
        commands[name] = runs[0].split("attention-conformance", 1)[1]
        assert "--conformance-report" in commands[name]
        uploads = [step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact")]
        assert uploads and uploads[0]["if"] == "always()"
    assert "--device cuda" in commands["gpu"] and "--device cpu" in commands["cpu"]
    # The CPU job's options, as the console script passes them to pytest, on a module of this checkout.
    args = shlex.split(commands["cpu"].replace('"$IMPL"', "examples.my_attention").replace("reports/", f"{tmp_path}/"))
    done = run("-m", "attention_conformance", *args, "--collect-only", "-q", "-p", "no:cacheprovider")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "test_fixture[" in done.stdout

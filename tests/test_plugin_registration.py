"""The pytest plugin's registration and defaults in a source checkout, the GitHub Actions example, and
missing spec data (the installed wheel itself: tests/test_wheel_install.py)."""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from attention_conformance.conformance import plugin
from attention_conformance.conformance.cases.fixtures import fixtures
from attention_conformance.conformance.reporting import merge_cli
from attention_conformance.conformance.specdata import ROOT, SpecError, clauses

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


def test_a_checkout_without_the_entry_point_defaults_to_xdist_workers_too():
    """conftest.py registers the plugin too late to add `-n auto` to the arguments; it sets the parsed options instead
    (a GPU run in a checkout had run in one process). `-n 0` still means one process."""
    common = ("-m", "pytest", "conformance/test_fixtures.py", "--impl", "examples.my_attention", "-v",
              "-p", "no:cacheprovider", "-p", "_hypothesis_pytestplugin", "-p", "xdist.plugin")
    default = run(*common, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    assert default.returncode == 0, default.stdout[-3000:] + default.stderr[-2000:]
    assert "[gw0]" in default.stdout
    one = run(*common, "-n", "0", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-2000:]
    assert "[gw0]" not in one.stdout and "passed" in one.stdout


def test_xdist_can_be_left_out():
    """`-n auto` is the plugin's default, not an addopts entry: `-p no:xdist` runs in one process."""
    done = run("-m", "pytest", "conformance/test_fixtures.py", "--impl", "examples.my_attention", "-q",
               "-p", "no:cacheprovider", "-p", "no:xdist")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "passed" in done.stdout and "workers" not in done.stdout


def test_without_ml_dtypes_the_other_dtypes_run_and_bfloat16_is_skipped_with_its_reason():
    """ml_dtypes is a dependency, but a Python that lacks it (a system interpreter with pytest and NumPy) collects
    and runs: bfloat16 and the 8-bit dtypes are skipped naming it; collection once crashed (INTERNALERROR) checking
    the FP8 fixtures' values."""
    code = ("import sys; sys.modules['ml_dtypes'] = None; import pytest; "  # None in sys.modules: ImportError
            "sys.exit(pytest.main(['conformance/test_fixtures.py', 'conformance/test_fp8.py', '--impl', "
            "'builtin:numpy_native', '-q', '-n', '0', '-p', 'no:cacheprovider', '-rs']))")
    done = run("-c", code)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "INTERNALERROR" not in done.stdout + done.stderr
    assert re.search(r"\d+ passed", done.stdout.splitlines()[-1]), done.stdout[-2000:]
    assert re.search(r"\d+ x bfloat16 needs ml_dtypes \(ml_dtypes is not importable", done.stdout), done.stdout[-3000:]


def test_missing_spec_data_is_a_loud_error(tmp_path):
    with pytest.raises(SpecError, match=f"no clauses.*yaml in {tmp_path}"):
        clauses(tmp_path)
    with pytest.raises(SpecError, match=f"no .*yaml fixture file in {tmp_path}"):
        fixtures(tmp_path)


def _steps(job: dict, uses: str) -> list[dict]:
    return [step for step in job["steps"] if step.get("uses", "").startswith(uses)]


def _suite_command(job: dict, name: str) -> str:
    runs = [step["run"] for step in job["steps"] if "attention-conformance --impl" in step.get("run", "")]
    assert len(runs) == 1, name
    return runs[0].split("attention-conformance", 1)[1]


def test_the_github_actions_example_runs_shards_and_merges_them(tmp_path):
    """The workflow's structure (jobs, needs, the shard matrix, artifacts, caches) and every command it runs, with
    its options checked by the suite's own parsers (docs/ci.md explains the workflow)."""

    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    assert set(jobs) == {"plan", "cpu", "gpu", "merge"}
    plan, cpu, gpu, merged = jobs["plan"], jobs["cpu"], jobs["gpu"], jobs["merge"]
    assert cpu["runs-on"] == "ubuntu-latest" and "self-hosted" in gpu["runs-on"]
    assert cpu["needs"] == "plan" and set(merged["needs"]) == {"cpu", "gpu"} and "!cancelled()" in merged["if"]
    shards = int(workflow["env"]["SHARDS"])
    assert cpu["strategy"]["matrix"]["shard"] == list(range(1, shards + 1)) and cpu["strategy"]["fail-fast"] is False
    commands = {"cpu": _suite_command(cpu, "cpu"), "gpu": _suite_command(gpu, "gpu")}
    for command in commands.values():
        assert "--conformance-report" in command and "--hypothesis-profile ci" in command
    assert "--device cuda" in commands["gpu"] and "--device cpu" in commands["cpu"]
    assert "--shard ${{ matrix.shard }}/$SHARDS" in commands["cpu"]
    assert "--shard-durations durations.json" in commands["cpu"]
    # Every runner uploads its reports (also when it fails) under a name the merge job downloads; the durations of
    # the plan job are not among them, and every shard splits by that one file.
    durations = _steps(plan, "actions/upload-artifact")[0]["with"]["name"]
    assert _steps(cpu, "actions/download-artifact")[0]["with"]["name"] == durations
    pattern = _steps(merged, "actions/download-artifact")[0]["with"]["pattern"]
    for job in (cpu, gpu):
        upload = _steps(job, "actions/upload-artifact")[0]
        name = upload["with"]["name"].replace("${{ matrix.shard }}", "2")
        assert upload["if"] == "always()" and fnmatch.fnmatch(name, pattern)
    assert not fnmatch.fnmatch(durations, pattern)
    # The compile caches: the plugin's directory, keyed as docs/ci.md says (OS, Python, jax and jaxlib), per shard.
    cache = _steps(cpu, "actions/cache@")[0]["with"]
    assert cache["path"] == f".pytest_cache/d/{plugin.COMPILATION_CACHE}"
    for part in ("runner.os", "py3.11", "steps.versions.outputs.jax", "matrix.shard"):
        assert part in cache["key"] and part in cache["restore-keys"]
    assert "jax jaxlib" in next(step["run"] for step in cpu["steps"] if step.get("id") == "versions")
    # The runners' options, as the console script passes them to pytest, on a module of this checkout.
    collected = {}
    for name, ok in (("cpu", (0,)), ("gpu", (0, 5))):  # gpu: no GPU here, every item deselected
        text = (commands[name].replace('"$IMPL"', "examples.my_attention").replace("reports/", f"{tmp_path}/")
                .replace("${{ matrix.shard }}", "2").replace("$SHARDS", str(shards))
                .replace("durations.json", f"{tmp_path}/d.json"))
        done = run("-m", "attention_conformance", *shlex.split(text), "--collect-only", "-q", "-p", "no:cacheprovider")
        assert done.returncode in ok and "error" not in done.stderr, done.stdout[-3000:] + done.stderr[-2000:]
        collected[name] = done.stdout
    assert "test_fixture[" in collected["cpu"]
    # The merge job's command, by the merge command's own parser.
    script = next(step["run"] for step in merged["steps"] if "attention-conformance merge" in step.get("run", ""))
    line = next(line for line in script.splitlines() if line.strip().startswith("attention-conformance merge"))
    args = shlex.split(line.replace('"${baseline[@]}"', "--baseline old.json"))[2:]
    parsed = merge_cli._parser().parse_args(args)
    assert parsed.reports == ["runners/"] and parsed.output and parsed.durations_out == "durations.json"
    assert parsed.baseline == "old.json"

"""The suite as a kernel author gets it: the built wheel, installed into a fresh virtual environment,
run from an empty directory of their own against a module there (README, "From your own repository").

The wheel is built from a copy of the sources (so that no build/ lands in the repository), the
venv borrows this environment's dependencies through a .pth file (nothing is downloaded) and gets the
suite itself from the wheel alone. The user's directory holds packages named `implementations` and
`conformance`, which the suite must not shadow. About 30 s on two cores; deselect with
`-m "not wheel_install"`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

from attention_conformance.conformance.specdata import ROOT

# Builds, installs and runs the suite three times over: more than the default 120 s per test under load.
pytestmark = [pytest.mark.selfcheck, pytest.mark.wheel_install, pytest.mark.timeout(400)]

SOURCES = ("attention_conformance", "conformance", "implementations", "spec", "fixtures", "pyproject.toml", "README.md")
CORRECT = (ROOT / "examples" / "my_attention.py").read_text()
# The scores scaled by 1/Dk instead of 1/sqrt(Dk): sdpa.scale-default and most fixtures reject it.
BROKEN = CORRECT.replace("q.shape[-1] ** -0.5", "q.shape[-1] ** -1.0")


def _setuptools_major() -> int:
    try:
        return int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return 0


def clean_environment() -> dict[str, str]:
    environment = {**os.environ}
    for variable in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST",
                     "ATTENTION_CONFORMANCE_IMPL", "ATTENTION_CONFORMANCE_FIXTURES", "VIRTUAL_ENV",
                     "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        environment.pop(variable, None)
    return environment


def run(command, cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=clean_environment())


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv holding the suite from the built wheel; its dependencies are this environment's."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    # Offline with this environment's setuptools when it meets pyproject.toml's build requirement; otherwise (an
    # older setuptools, a fresh venv's bundled 65.x, or none from Python 3.12) pip builds in isolation, as
    # `pip install -e .` did.
    offline = ["--no-build-isolation", "--no-index"] if _setuptools_major() >= 77 else []
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", *offline, "--disable-pip-version-check", "-q",
                 "-w", work / "dist", source], cwd=work)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next((work / "dist").glob("attention_conformance-*.whl"))

    environment = work / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", environment], cwd=work)
    assert made.returncode == 0, made.stderr
    python = environment / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=work).stdout.strip())
    borrowed = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    (site / "borrowed-dependencies.pth").write_text("".join(f"{path}\n" for path in borrowed))
    installed = run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
                     "--disable-pip-version-check", "-q", wheel], cwd=work)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return environment


@pytest.fixture(scope="module")
def user_project(tmp_path_factory) -> Path:
    """An author's directory: a correct and a broken module, and their own `implementations`/`conformance`."""
    project = tmp_path_factory.mktemp("project")
    (project / "good_attn.py").write_text("from implementations import OWN\nassert OWN == 'mine'\n" + CORRECT)
    (project / "broken_attn.py").write_text(BROKEN)
    for package in ("implementations", "conformance"):
        (project / package).mkdir()
        (project / package / "__init__.py").write_text("OWN = 'mine'\n")
    return project


def test_the_suite_comes_from_the_wheel_with_its_data(venv, user_project):
    probe = ("import attention_conformance, conformance, implementations\n"
             "from attention_conformance.conformance import specdata\n"
             "from attention_conformance.conformance.cases import fixtures\n"
             "print(attention_conformance.__file__); print(len(specdata.clauses()), len(fixtures.fixtures()))\n"
             "print(conformance.OWN, implementations.OWN)\n"
             "from attention_conformance.conformance.reporting import shards; print(len(shards.read_durations(None)[0]))")
    done = run([venv / "bin" / "python", "-c", probe], cwd=user_project)
    assert done.returncode == 0, done.stderr
    location, counts, own, durations = done.stdout.splitlines()
    assert int(durations) > 0  # --shard's default durations file ships in the wheel
    assert Path(location).resolve().is_relative_to(venv.resolve()), location
    clause_count, fixture_count = map(int, counts.split())
    assert clause_count > 0 and fixture_count > 0
    assert own == "mine mine"  # the user's packages are not shadowed by the suite's


def test_a_correct_module_passes_from_its_own_directory(venv, user_project):
    report = user_project / "out" / "conformance.json"
    done = run([venv / "bin" / "python", "-m", "pytest", "--pyargs", "attention_conformance.conformance",
                "--impl", "good_attn", "-n", "2", "-p", "no:cacheprovider", "--conformance-report", report],
               cwd=user_project)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\d+ passed", done.stdout) and "created: 2/2 workers" in done.stdout, done.stdout[-3000:]
    data = json.loads(report.read_text())
    assert data["summary"]["good_attn"]["failed"] == 0 and data["summary"]["good_attn"]["passed"] > 0, data["summary"]
    # The console script's merge subcommand, on that report.
    done = run([venv / "bin" / "attention-conformance", "merge", report, "-o", user_project / "out" / "merged.json"],
               cwd=user_project)
    assert done.returncode == 0 and "merged 1 report(s) into 1 environment(s)" in done.stdout, done.stdout + done.stderr
    assert json.loads((user_project / "out" / "merged.json").read_text())["kind"] == "merged"


def test_a_broken_module_fails_with_a_repro_that_reproduces(venv, user_project):
    done = run([venv / "bin" / "attention-conformance", "--impl", "broken_attn", "-n", "0", "-x",
                "-p", "no:cacheprovider"], cwd=user_project)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    # The failure block: "[clause] case", the problem, then the repro command (a bare ID: saved under the rootdir).
    clause = re.search(r"^E   \[([a-z0-9_.-]+)\] ", done.stdout, re.MULTILINE).group(1)
    repro_id = re.search(r"repro: attention-conformance repro ([0-9a-f]+)$", done.stdout, re.MULTILINE).group(1)

    repro = run([venv / "bin" / "attention-conformance", "repro", repro_id], cwd=user_project)
    output = repro.stdout + repro.stderr
    assert "No module named" not in output, output
    assert repro.returncode == 1 and f"FAILED [{clause}]" in output, output
    script = run([venv / "bin" / "attention-conformance", "repro", repro_id, "--print-python"], cwd=user_project)
    assert script.returncode == 0 and "'broken_attn'" in script.stdout, script.stderr
    shown = run([venv / "bin" / "python", "-c", script.stdout], cwd=user_project)
    if "run_fixture_repro" in script.stdout:  # a fixture's script re-raises the verdict
        assert shown.returncode != 0 and clause in shown.stdout + shown.stderr, shown.stdout + shown.stderr
    else:  # a generated case's script prints the error against the oracle
        error = float(re.search(r"max abs error (\S+)", shown.stdout).group(1))
        assert shown.returncode == 0 and error > 1e-3, shown.stdout + shown.stderr


def test_xdist_off_and_a_project_of_its_own_are_left_alone(venv, user_project, tmp_path):
    """`-p no:xdist` runs in one process; another project's pytest run does not engage the plugin."""
    done = run([venv / "bin" / "python", "-m", "pytest", "--pyargs", "attention_conformance.conformance.test_fixtures",
                "--impl", "good_attn", "-p", "no:xdist", "-p", "no:cacheprovider", "-q"], cwd=user_project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "workers" not in done.stdout

    (tmp_path / "test_theirs.py").write_text("def test_theirs():\n    assert True\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    theirs = run([venv / "bin" / "python", "-m", "pytest", "-p", "no:cacheprovider"], cwd=tmp_path)
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
    assert "1 passed" in theirs.stdout and "workers" not in theirs.stdout
    assert "attention conformance" not in theirs.stdout
    helped = run([venv / "bin" / "python", "-m", "pytest", "--help"], cwd=tmp_path)
    assert helped.stdout.count("--impl=MODULE[:ATTR]") == 1, helped.stdout

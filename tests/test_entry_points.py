"""Discovery without --impl: an installed package's entry point, $ATTENTION_CONFORMANCE_IMPL,
and what --list-impls prints.

The third-party package (tests/entrypoint_pkg) is installed once per module with
`pip install --no-deps --no-build-isolation --target DIR` from a copy (so that no
build/ or .egg-info lands in the repository), about 3 s, and made visible with
PYTHONPATH=DIR, which is all importlib.metadata needs to find its entry point.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attention_conformance.conformance.plugin import ENTRY_POINT_GROUP, ENV_VAR
from attention_conformance.conformance.specdata import ROOT

pytestmark = pytest.mark.selfcheck

PACKAGE = ROOT / "tests" / "entrypoint_pkg"


def clean_environment(**extra: str) -> dict[str, str]:
    environment = {**os.environ}
    for variable in ("PYTEST_XDIST_WORKER", ENV_VAR, "PYTEST_ADDOPTS"):
        environment.pop(variable, None)
    environment.update(extra)
    return environment


def with_pythonpath(*paths: Path) -> dict[str, str]:
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([*(str(p) for p in paths), *([existing] if existing else [])])}


def pytest_run(*args: str, env: dict[str, str] | None = None, timeout: int = 100):
    command = [sys.executable, "-m", "pytest", "conformance/test_fixtures.py", "-q", "-n", "0", "-p", "no:cacheprovider",
               "-W", "ignore::DeprecationWarning", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=clean_environment(**(env or {})))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A directory holding the installed third-party package and its dist-info."""
    work = tmp_path_factory.mktemp("entrypoint")
    source = work / "src"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, f"pip could not install tests/entrypoint_pkg:\n{done.stdout}\n{done.stderr}"
    entry_points = list(target.glob("attn_thirdparty-*.dist-info/entry_points.txt"))
    assert entry_points and f"[{ENTRY_POINT_GROUP}]" in entry_points[0].read_text()
    return target


def test_list_impls_finds_the_entry_point(site):
    done = pytest_run("--no-builtins", "--list-impls", env=with_pythonpath(site))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    header = [line for line in lines if line.startswith("thirdparty_sdpa ")]
    assert header and header[0].split()[1] == "attn_thirdparty", done.stdout
    assert "array=numpy dtypes=float32,float64 fully_masked_rows=zeros" in done.stdout
    assert "operations: sdpa" in done.stdout
    assert "numpy_oracle" not in done.stdout  # --no-builtins


def test_the_entry_point_implementation_is_validated(site):
    done = pytest_run("--no-builtins", "-rA", env=with_pythonpath(site))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    passed = [line for line in done.stdout.splitlines() if line.startswith("PASSED") and "thirdparty_sdpa-cpu-" in line]
    assert any("thirdparty_sdpa-cpu-float32" in line for line in passed), done.stdout[-3000:]
    assert any("thirdparty_sdpa-cpu-float64" in line for line in passed), done.stdout[-3000:]
    summary = done.stdout.split("attention conformance", 1)[-1]
    assert "thirdparty_sdpa" in summary and " passed" in summary
    assert not re.search(r"\b[1-9]\d* (cases )?failed", summary.split("short test summary")[0]), summary


def test_the_environment_variable_names_the_implementations(tmp_path):
    done = pytest_run("-rA", env={ENV_VAR: "examples.my_attention"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    ids = [line for line in done.stdout.splitlines() if line.startswith("PASSED")]
    assert ids and all("examples_my_attention-cpu-" in line for line in ids), ids[:5]
    assert "numpy_oracle" not in done.stdout and "torch_sdpa" not in done.stdout  # it replaces the built-ins

    listed = pytest_run("--list-impls", env={ENV_VAR: " examples.my_attention , examples.wrong_axis_softmax "})
    assert listed.returncode == 0, listed.stdout + listed.stderr
    names = [line.split()[0] for line in listed.stdout.splitlines() if line and not line.startswith((" ", "Exit"))]
    assert names == ["examples_my_attention", "examples_wrong_axis_softmax"], listed.stdout


def test_list_impls_prints_names_dtypes_and_operations():
    done = pytest_run("--impl", "examples.my_attention", "--impl", "examples.wrong_axis_softmax", "--list-impls")
    assert done.returncode == 0, done.stdout + done.stderr
    blocks = _blocks(done.stdout)
    assert list(blocks) == ["examples_my_attention", "examples_wrong_axis_softmax"]
    mine, wrong = blocks["examples_my_attention"], blocks["examples_wrong_axis_softmax"]
    assert mine[0].split() == ["examples_my_attention", "examples.my_attention"]
    assert "array=numpy dtypes=float32,float64 fully_masked_rows=zeros" in mine[1]
    assert mine[2].strip() == "operations: sdpa" and wrong[2].strip() == "operations: softmax"
    assert mine[3].strip() == "devices: cpu"
    assert "collected" not in done.stdout  # it lists and exits before running anything


def test_list_impls_prints_per_device_dtypes(tmp_path):
    """DTYPES given per device is printed per device, and KNOWN_DEVIATIONS are listed."""
    (tmp_path / "per_device_attention.py").write_text(textwrap.dedent("""
        import numpy as np
        DTYPES = {"cpu": ["float64"], "cuda": ["float16", "float32"]}
        KNOWN_DEVIATIONS = [{"clause": "softmax.large-inputs", "when": lambda facts: False, "reason": "overflows"}]
        def softmax(x, axis=-1):
            e = np.exp(x - x.max(axis=axis, keepdims=True))
            return e / e.sum(axis=axis, keepdims=True)
    """))
    done = pytest_run("--impl", "per_device_attention", "--list-impls", env=with_pythonpath(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dtypes=cpu: float64; cuda: float16,float32 " in done.stdout, done.stdout
    assert "operations: softmax" in done.stdout
    assert "declared deviation of softmax.large-inputs: overflows" in done.stdout


def _blocks(listing: str) -> dict[str, list[str]]:
    """--list-impls output: one block per implementation, its header line first."""
    blocks: dict[str, list[str]] = {}
    current = None
    for line in listing.splitlines():
        if not line or line.startswith("Exit"):
            continue
        if not line.startswith(" "):
            current = line.split()[0]
            blocks[current] = [line]
        elif current:
            blocks[current].append(line)
    return blocks

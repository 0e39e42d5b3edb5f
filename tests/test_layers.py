"""The package's layers hold: import-linter's contracts of pyproject.toml, every module in a layer, none too long.

In a checkout the top-level directories conformance/ and implementations/ become subpackages of
attention_conformance only at run time (attention_conformance/__init__.py extends its __path__), which a static
import graph does not see; the wheel holds them in place. So the check copies the package's Python files into the
wheel's layout and runs import-linter there, in a fresh interpreter (this one has imported the checkout's
attention_conformance already).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from attention_conformance.conformance.specdata import ROOT

PACKAGE_DIRS = {"attention_conformance": ROOT / "attention_conformance", "conformance": ROOT / "conformance",
                "implementations": ROOT / "implementations"}
MAX_MODULE_LINES = 800


def _wheel_layout(target: Path) -> Path:
    """The package's .py files under target/attention_conformance, as the wheel lays them out."""
    package = target / "attention_conformance"
    for name, source in PACKAGE_DIRS.items():
        destination = package if name == "attention_conformance" else package / name
        for path in source.rglob("*.py"):
            copy = destination / path.relative_to(source)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
    return target


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _lint(wheel: Path) -> subprocess.CompletedProcess:
    """import-linter on the package in ``wheel`` (needs the [selfcheck] extra, which [all] installs)."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            f"sys.exit(lint_imports(config_filename={str(ROOT / 'pyproject.toml')!r}, no_cache=True))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(wheel)}, cwd=wheel, timeout=300)


def test_the_layers_hold_and_no_import_circle(tmp_path):
    done = _lint(_wheel_layout(tmp_path))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "Contracts: 2 kept, 0 broken" in done.stdout, done.stdout[-3000:]


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The check can fail: the oracle importing the registry (a layer above it) inside a function, where the suite's
    lazy imports are, is reported."""
    wheel = _wheel_layout(tmp_path)
    oracle = wheel / "attention_conformance" / "conformance" / "reference" / "oracle.py"
    oracle.write_text(oracle.read_text() + "\n\ndef _upward():\n"
                      "    from attention_conformance.implementations import registry  # noqa: F401\n")
    done = _lint(wheel)
    words = " ".join(done.stdout.split())  # import-linter wraps its lines
    assert done.returncode != 0 and "BROKEN" in done.stdout, done.stdout[-3000:]
    assert "attention_conformance.conformance.reference.oracle -> attention_conformance.implementations.registry" \
        in words, done.stdout[-3000:]


def _modules() -> list[str]:
    names = []
    for name, source in PACKAGE_DIRS.items():
        for path in source.rglob("*.py"):
            parts = list(path.relative_to(source).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            prefix = ["attention_conformance"] + ([] if name == "attention_conformance" else [name])
            names.append(".".join(prefix + parts))
    return names


def test_every_module_lies_in_a_layer():
    layers = [item.strip() for layer in next(c for c in _contracts() if c["type"] == "layers")["layers"]
              for item in layer.replace(":", "|").split("|")]
    # the packages themselves (their __init__ holds a docstring) are the containers of the layers
    containers = {"attention_conformance", "attention_conformance.conformance", "attention_conformance.implementations"}
    outside = [m for m in _modules() if m not in containers
               and not any(m == layer or m.startswith(layer + ".") for layer in layers)]
    assert not outside, f"modules in no layer of pyproject.toml's contract: {outside}"


def test_no_module_is_longer_than_the_limit():
    long = {str(path.relative_to(ROOT)): n for source in PACKAGE_DIRS.values() for path in source.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_a_circle_inside_a_layer_breaks_the_contract(tmp_path):
    """Two modules of one layer importing each other (cases/limits.py, which cases/mha.py imports, importing mha
    back inside a function) are reported, though the layers contract allows imports within a layer."""
    wheel = _wheel_layout(tmp_path)
    limits = wheel / "attention_conformance" / "conformance" / "cases" / "limits.py"
    limits.write_text(limits.read_text() + "\n\ndef _around():\n"
                      "    from attention_conformance.conformance.cases import mha  # noqa: F401\n")
    done = _lint(wheel)
    assert done.returncode != 0 and "No cycles are allowed in attention_conformance.conformance.cases" in " ".join(
        done.stdout.split()), done.stdout[-3000:]

"""The suite's own arithmetic warns nothing into a user's run; the implementation's own warnings still show.

Implementations that return NaN (examples/shape_and_nan_attention.py: NaN outputs; tests/nan_standins.py: NaN in one
row; zoo/correct_nan_fully_masked.py: NaN rows declared) and one whose own code warns
(examples/wrong_axis_softmax.py: "invalid value encountered in subtract" on rows of -inf) run as a user runs them,
with every RuntimeWarning shown (``-W always::RuntimeWarning``) and the report written (the HTML page's plots). No
warning in pytest's warnings summary may point into the suite (conformance/, implementations/, attention_conformance/):
where the oracle, the tolerance model or the verdict meet NaN or infinity on purpose, a scoped np.errstate says so.
The implementation's warning must still be there: the suite never silences what the code under test reports.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .test_cli import ROOT, pytest_run

pytestmark = [pytest.mark.selfcheck, pytest.mark.timeout(400)]

SUITE_DIRECTORIES = [ROOT / "conformance", ROOT / "implementations", ROOT / "attention_conformance"]
WARNING_LINE = re.compile(r"^\s+(\S+\.py):(\d+): (\w*Warning): (.*)$")
NAN_PRODUCING = ("examples.shape_and_nan_attention", "tests.nan_standins:NaNInOneRow", "zoo.correct_nan_fully_masked")
TESTS = ("conformance/test_properties.py", "conformance/test_fixtures.py")  # softmax, sdpa, MHA: properties, fixtures


def summary_warnings(out: str) -> list[tuple[Path, int, str, str]]:
    """(file, line, category, message) of each warning in pytest's warnings summary."""
    if "warnings summary" not in out:
        return []
    section = out.split("warnings summary", 1)[1].split("-- Docs:", 1)[0]
    found = []
    for line in section.splitlines():
        match = WARNING_LINE.match(line)
        if match:
            path = Path(match.group(1))
            found.append(((path if path.is_absolute() else ROOT / path).resolve(), int(match.group(2)),
                          match.group(3), match.group(4)))
    return found


def in_suite(path: Path) -> bool:
    return any(directory == path or directory in path.parents for directory in SUITE_DIRECTORIES)


def test_implementations_with_nan_and_inf_meet_no_warning_from_the_suites_own_code(tmp_path):
    impls = [arg for spec in ("examples.wrong_axis_softmax", *NAN_PRODUCING) for arg in ("--impl", spec)]
    done = pytest_run(*TESTS, *impls, "-W", "always::RuntimeWarning", "--conformance-report", str(tmp_path / "run.json"),
                      timeout=390)
    assert done.returncode == 1 and " failed" in done.stdout.splitlines()[-1], done.stdout[-3000:]
    warned = summary_warnings(done.stdout)
    ours = [warning for warning in warned if in_suite(warning[0])]
    assert not ours, "\n".join(f"{path}:{line}: {category}: {message}" for path, line, category, message in ours)
    # The implementation's own warning is the user's to see.
    assert any(path.name == "wrong_axis_softmax.py" and category == "RuntimeWarning"
               for path, _, category, _ in warned), done.stdout[-3000:]

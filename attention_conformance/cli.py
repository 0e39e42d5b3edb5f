"""`attention-conformance [pytest options]`: pytest on the installed conformance tests, from any directory.

`attention-conformance --impl mymodule` runs `python -m pytest --pyargs attention_conformance.conformance
--impl mymodule` with this interpreter: MODULE is imported from the current directory (or PYTHONPATH),
every pytest and suite option passes through, and the exit status is pytest's (0 if and only if every
applicable case passed).
"""
from __future__ import annotations

import os
import subprocess
import sys

TEST_PACKAGE = "attention_conformance.conformance"


def command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "--pyargs", TEST_PACKAGE, *args]


def main(argv: list[str] | None = None) -> int:
    # A fresh interpreter rather than pytest.main here: this process has imported attention_conformance
    # already, which pytest could then not rewrite (a PytestAssertRewriteWarning), and `python -m pytest`
    # puts the current directory on sys.path exactly as the documented command does.
    full = command(sys.argv[1:] if argv is None else list(argv))
    if os.name == "posix":
        sys.stdout.flush()
        os.execv(sys.executable, full)
    return subprocess.call(full)

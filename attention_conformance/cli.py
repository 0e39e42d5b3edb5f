"""`attention-conformance [pytest options]`: pytest on the installed conformance tests, from any directory.

`attention-conformance --impl mymodule` runs `python -m pytest --pyargs attention_conformance.conformance
--impl mymodule` with this interpreter: MODULE is imported from the current directory (or PYTHONPATH),
every pytest and suite option passes through, and the exit status is pytest's (0 if and only if every
applicable case passed).

`attention-conformance merge REPORT... -o combined.json` merges the JSON reports of several runners (and the
shards of a split run) into one matrix (conformance/merge.py, docs/ci.md).
"""
from __future__ import annotations

import os
import subprocess
import sys

TEST_PACKAGE = "attention_conformance.conformance"


def command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "--pyargs", TEST_PACKAGE, *args]


def merge_command(args: list[str]) -> int:
    """`attention-conformance merge ...`: no pytest run, so this process does the work itself."""
    from attention_conformance.conformance import merge

    return merge.main(args)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["merge"]:
        return merge_command(args[1:])
    # A fresh interpreter rather than pytest.main here: this process has imported attention_conformance
    # already, which pytest could then not rewrite (a PytestAssertRewriteWarning), and `python -m pytest`
    # puts the current directory on sys.path exactly as the documented command does.
    full = command(args)
    if os.name == "posix":
        sys.stdout.flush()
        os.execv(sys.executable, full)
    return subprocess.call(full)

"""`attention-conformance [pytest options]`: pytest on the installed conformance tests, from any directory.

`attention-conformance --impl mymodule` runs `python -m pytest --pyargs attention_conformance.conformance
--impl mymodule` with this interpreter: MODULE is imported from the current directory (or PYTHONPATH),
every pytest and suite option passes through, and the exit status is pytest's (0 if and only if every
applicable case passed).

`attention-conformance repro ID [--impl SPEC] [--print-python]` replays one failure of a run (its block prints the
command; conformance/judging/evidence.py): exit status 1 if it still fails, 0 if it passes (or is not judged:
unsupported, a
declared deviation), 2 if the repro cannot be found or run.

`attention-conformance merge REPORT... -o combined.json` merges the JSON reports of several runners (and the
shards of a split run) into one matrix (conformance/reporting/merge.py, docs/ci.md).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

TEST_PACKAGE = "attention_conformance.conformance"
REPRO_COMMAND = "repro"


def command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "--pyargs", TEST_PACKAGE, *args]


def merge_command(args: list[str]) -> int:
    """`attention-conformance merge ...`: no pytest run, so this process does the work itself."""
    from attention_conformance.conformance.reporting import merge_cli

    return merge_cli.main(args)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == [REPRO_COMMAND]:
        return repro_main(args[1:])
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


def repro_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attention-conformance repro",
        description="Replay one failure of a conformance run: the implementation is called on the saved case through "
                    "the suite's own path (layout, dtype, device), judged against the oracle, and the verdict printed. "
                    "Exit status 1 if it still fails, 0 if it passes or is not judged, 2 if it cannot be replayed.")
    parser.add_argument("id", metavar="ID|PATH",
                        help="the ID a failure block prints (looked up in .pytest_cache/d/attention-conformance/repro or "
                             ".attention-conformance/repro, here or above), or the path of its .npz file")
    parser.add_argument("--impl", metavar="MODULE[:ATTR]", default=None,
                        help="replay on this implementation instead of the one that failed (a fixed version, say)")
    parser.add_argument("--print-python", action="store_true",
                        help="print a standalone Python script of the failed case (the call, the oracle and the error) "
                             "instead of replaying it")
    return parser


def repro_main(argv: list[str]) -> int:
    options = repro_parser().parse_args(argv)
    # As `python -m pytest` does: --impl modules import from the directory the run was started in.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from attention_conformance.conformance.harness import replay
    from attention_conformance.conformance.judging.evidence import ReproError, find
    from attention_conformance.implementations.registry import ImplementationLoadError

    try:
        saved = replay.load(find(options.id))
        if options.print_python:
            sys.stdout.write(replay.python_script(saved, options.impl))
            return 0
        return replay.replay_and_report(saved, options.impl, print)
    except (ReproError, ImplementationLoadError) as exc:
        print(f"attention-conformance repro: {exc}", file=sys.stderr)
        return 2

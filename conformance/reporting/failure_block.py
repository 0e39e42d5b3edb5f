"""The failure block pytest prints for a verdict: a few lines a person reads, instead of a traceback.

At the end of a test that failed with verdicts (ConformanceFailure, HungEarlier, a ShrinkingStopped around one, or
Hypothesis's group of them), in the process that ran it (an xdist worker), ``after_test`` saves each verdict's repro
file (conformance/judging/evidence.py) and marks its record with the ID. Unless the command line names a traceback style
(``--tb=long``, ``--tb=short``, ...: the whole traceback, for debugging the suite), the report's longrepr then
becomes one block per verdict::

    [sdpa.finite] B1 Hq3/Hkv1 Lq3 Lk7 Dk1 Dv1 mask=none causal scale=-1.0 scores~unit seed=3280387012
      9 non-finite output element(s) where the oracle is finite; worst element (0, 0, 0, 0): got nan, oracle 0.0126
      repro: attention-conformance repro 3f9a2c1b0d

the clause and the case's label, the problem with the worst element (got against the oracle, the error against the
allowed error), and one command that replays it. No array is printed: the repro file holds them, whatever their
size, within its directory's bound: a repro the bound left out reads ``repro: not kept: why``, one that could not
be written ``repro: not saved: the error``. The block is a pytest ExceptionChainRepr (one entry of "E" lines), so
xdist carries it to the controller as it carries any traceback, and the short test summary's line reads "[clause]
problem". A test that failed any other way (an error of the suite itself) keeps pytest's traceback.
"""
from __future__ import annotations

import textwrap

from attention_conformance.conformance.judging.containment import HungEarlier
from attention_conformance.conformance.judging.evidence import NotKept, command, save
from attention_conformance.conformance.judging.messages import ConformanceFailure

try:
    _GROUP = BaseExceptionGroup
except NameError:  # Python 3.10: Hypothesis raises the backport's
    from exceptiongroup import BaseExceptionGroup as _GROUP


WIDTH = 120  # characters of a block line after pytest's "E   "


HEAD_WIDTH = 132  # the first line, "[clause] case label": most labels fit whole (a gradient case's names two seeds)


LABEL_LINES = 2  # a longer case label (a derived case listing a permutation, say) is cut; its repro holds it all


def verdicts(error: BaseException) -> list[BaseException] | None:
    """The verdicts ``error`` is made of (each with its evidence), or None when any part of it is something else."""
    from attention_conformance.conformance.harness.properties import ShrinkingStopped

    if isinstance(error, ShrinkingStopped):
        return verdicts(error.__cause__) if error.__cause__ is not None else None
    if isinstance(error, (ConformanceFailure, HungEarlier)):
        return [error] if getattr(error, "evidence", None) is not None else None
    if isinstance(error, _GROUP):
        found = []
        for part in error.exceptions:
            inner = verdicts(part)
            if inner is None:
                return None
            found.extend(inner)
        return found
    return None


def after_test(item, call, report) -> None:
    """pytest_runtest_makereport, in the process that ran the test: save the repros of its verdicts and, unless a
    traceback style was asked for, print them as blocks."""
    if call.excinfo is None or not report.failed:
        return
    error = call.excinfo.value
    found = verdicts(error)
    if not found:
        return
    unsaved = {}
    for failure in found:
        evidence = failure.evidence
        try:
            save(evidence)
        except NotKept as why:
            unsaved[evidence.id] = f"not kept: {why}"
            continue
        except Exception as exc:  # noqa: BLE001 -- a repro that cannot be written must not end the run
            unsaved[evidence.id] = f"not saved: {type(exc).__name__}: {exc}"
            continue
        if failure.record is not None:
            failure.record.repro_id = evidence.id
    if item.config.option.tbstyle != "auto":
        return
    lines = []
    if len(found) > 1:
        lines.append(f"Hypothesis found {len(found)} distinct failures:")
    for failure in found:
        lines += block(failure, unsaved.get(failure.evidence.id))
    stopped = _shrinking_note(error)
    if stopped:
        lines.append(f"  ({stopped})")
    longrepr = _longrepr(item, lines, found[0])
    if longrepr is not None:
        report.longrepr = longrepr


def block(failure, unsaved: str | None = None) -> list[str]:
    """The lines of one verdict (module docstring); ``unsaved``: why its repro file is not there."""
    evidence = failure.evidence
    head = textwrap.wrap(f"[{failure.clause}] {evidence.case.label}", HEAD_WIDTH, subsequent_indent="    ",
                         break_on_hyphens=False)
    if len(head) > LABEL_LINES:
        head = head[:LABEL_LINES]
        head[-1] = head[-1][: HEAD_WIDTH - 4] + " ..."
    detail = evidence.problem + (f"; {_worst_words(evidence.worst)}" if evidence.worst else "")
    lines = head + textwrap.wrap(detail, WIDTH, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)
    if unsaved:
        lines += textwrap.wrap(f"repro: {unsaved}", WIDTH, initial_indent="  ", subsequent_indent="    ")
    else:
        lines.append(f"  repro: {command(evidence.id)}")
    return lines


def _worst_words(worst: str) -> str:
    return "worst element " + worst.removeprefix("index ") if worst.startswith("index ") else worst


def _shrinking_note(error: BaseException) -> str:
    from attention_conformance.conformance.harness.properties import SHRINK_BUDGET_S, ShrinkingStopped

    if isinstance(error, ShrinkingStopped):
        return (f"Hypothesis shrank this failure for SHRINK_BUDGET_S = {SHRINK_BUDGET_S:g} s (conformance/harness/properties.py)"
                ": the case above is the smallest failing one found by then")
    return ""


def _longrepr(item, lines: list[str], first):
    """The block as pytest's own failure representation: "E" lines, no source, no locals."""
    try:  # pytest's own classes (not public API): what --tb styles build, and what xdist knows how to carry
        from _pytest._code.code import ExceptionChainRepr, ReprEntry, ReprFileLocation, ReprTraceback
    except ImportError:
        return None  # another pytest: its traceback stays
    path, lineno, _ = item.location
    entry = ReprEntry(lines=[f"E   {line}" for line in lines], reprfuncargs=None, reprlocals=None, reprfileloc=None,
                      style="short")
    crash = ReprFileLocation(path=str(path), lineno=(lineno or 0) + 1,
                             message=f"[{first.clause}] {first.evidence.problem}")
    return ExceptionChainRepr([(ReprTraceback([entry], None, "short"), crash, None)])

"""The end-of-run summary in the terminal: per implementation the cases judged (counts.py), the root causes and the
clauses broken, the coverage rule, the comparison with a baseline and the skipped items by reason.

Counts are of distinct cases (records.distinct: a replayed example is one case), per implementation and per
operation; the JSON report (conformance/reporting/json_report.py) carries the same numbers as its ``summary``.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

from attention_conformance.conformance.harness import session
from attention_conformance.conformance.judging import verdict
from attention_conformance.conformance.judging.records import RECORDS
from attention_conformance.conformance.reporting import root_causes
from attention_conformance.conformance.reporting.counts import (
    implementation_lines,
    implementation_summary,
    incomplete_line,
)


def terminal_summary(tr, config) -> None:
    from attention_conformance.conformance.judging import agreement
    from attention_conformance.conformance.reporting import coverage, html_report

    entries = implementation_summary()
    stopped = incomplete_line(session.stop_reason())
    compared = baseline_lines(config)
    if not entries and not coverage.ABSENT and not (stopped and coverage.COLLECTED[0]) and not compared:
        return
    tr.section("attention conformance")
    if stopped:
        tr.write_line(stopped)
    left_out = config.stash.get(session.TOUR_LEFT_OUT_KEY, ())
    if entries and left_out:  # a bare dev-profile run (conformance/plugin.py, builtin_tour)
        tr.write_line(f"the dev profile's tour of the built-ins: each corner once, one Hypothesis example a property; "
                      f"{', '.join(left_out)} left out (--hypothesis-profile ci, or --impl builtin:NAME, runs them)")
    if entries:
        tr.write_line("cases per implementation (each distinct fixture case or Hypothesis example once; "
                      "not pytest tests):")
    for name, entry in entries.items():
        for line in implementation_lines(name, entry):
            tr.write_line(line)
    # What the failures share, one line a cause, before the clauses they are filed under (root_causes.py).
    for cause in root_causes.root_causes(RECORDS):
        tr.write_line(cause.line())
    # The clause that failed on the smallest case first (checks.breaks_order); each failure is
    # filed under the clause at fault, not the one its case was drawn for.
    for name, clause_ids in sorted(verdict.breaks_order(RECORDS).items()):
        tr.write_line(f"{name} breaks: {', '.join(clause_ids)}")
    for line in coverage.absent_lines():
        tr.write_line(line)
    for line in compared:  # --baseline: what changed since the earlier report (conformance/reporting/baseline.py)
        tr.write_line(line)
    from attention_conformance.conformance.reporting import shards

    shard = shards.terminal_line(config)
    if shard:
        tr.write_line(shard)
    skipped_lines(tr)

    pairs = len(agreement.matrix())
    if pairs:
        tr.write_line(f"cross-backend agreement ({pairs} pairs of implementations on shared cases, in ULPs): "
                      "in the report's agreement matrix (--conformance-report)")
    path = config.getoption("conformance_report", None)
    if path:
        tr.write_line(f"conformance report: {path} and {html_report.html_path(Path(path))}")


def baseline_lines(config) -> list[str]:
    from attention_conformance.conformance.reporting import baseline

    stash = getattr(config, "stash", None)
    return baseline.terminal_lines(stash.get(baseline.RESULT_KEY, None) if stash is not None else None)


def skipped_lines(tr) -> None:
    """pytest items skipped, one line per reason with its count (pyproject's -r leaves them out: every test of an
    implementation lacking an operation would be a line of its own). Absent devices are deselected instead
    (coverage.absent_lines)."""
    reasons: Counter = Counter()
    grouped: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # line -> who -> what
    for report in tr.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        not_exposed = NOT_EXPOSED.fullmatch(reason)
        missing = MISSING_KEYWORD.fullmatch(reason)
        if not_exposed:
            grouped[NOT_EXPOSED_LINE][not_exposed["impl"]].add(not_exposed["op"])
            reason = NOT_EXPOSED_LINE
        elif missing:
            grouped[MISSING_KEYWORD_LINE][f"{missing['impl']}.{missing['op']}"].update(
                k.strip(" '") for k in missing["keywords"].split(","))
            reason = MISSING_KEYWORD_LINE
        reasons[reason] += 1
    if reasons:
        tr.write_line(f"pytest items skipped ({sum(reasons.values())}), by reason:")
        ranked = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
        for reason, count in ranked[:SKIP_REASONS_SHOWN]:
            names = ""
            if reason in grouped:
                names = " " + "; ".join(f"{who} {', '.join(sorted(what))}" for who, what in sorted(grouped[reason].items()))
            tr.write_line(f"  {count:>4} x {reason[:150]}{names}")
        rest = ranked[SKIP_REASONS_SHOWN:]
        if rest:
            tr.write_line(f"  {sum(c for _, c in rest):>4} x {len(rest)} other reasons (pytest -rs lists every item)")


# Operations and keywords an implementation does not offer: one line each, naming who lacks what.
NOT_EXPOSED = re.compile(r"not implemented: (?P<impl>\S+) does not expose (?P<op>\w+)")


NOT_EXPOSED_LINE = "not implemented (operations not exposed):"


MISSING_KEYWORD = re.compile(r"(?:unsupported: )?(?P<impl>\S+)\.(?P<op>\w+) has no (?P<keywords>'?\w+'?(?:, '?\w+'?)*) "
                             r"parameter.*")


MISSING_KEYWORD_LINE = "unsupported (keywords not in the signature):"


# The default run stays short (under ~80 lines when nothing fails): the most frequent reasons, then one line.
SKIP_REASONS_SHOWN = 6

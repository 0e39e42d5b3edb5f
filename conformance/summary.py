"""The conformance counts of a run and its end-of-run summary in the terminal.

Counts are of distinct cases (report.distinct: a replayed example is one case), per implementation and per
operation; the JSON report (conformance/json_report.py) carries the same numbers as its ``summary``.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

from . import checks, root_causes, session
from .report import JUDGED, distinct

OPERATIONS = ("softmax", "sdpa", "multi_head_attention")  # the contract's order, for the per-operation counts
TOP_REASONS = 3  # unsupported reasons per implementation, in the terminal and in the report's summary
REASON_WIDTH = 60  # characters of one unsupported reason in the terminal
_NUMBER = re.compile(r"(?<![A-Za-z_])(\d+(?:\.\d+)?(?:e[-+]?\d+)?)")


def unsupported_reasons(records, limit: int = TOP_REASONS) -> list[tuple[str, int]]:
    """The most frequent reasons among unsupported ``records``, as (reason, count), most frequent first.

    A reason is the first line of the record's message. Reasons that differ only in
    numbers count as one ("head dim Dk 12 ..." and "head dim Dk 20 ..."); a number
    that varies among them is shown as <n>.
    """
    groups: dict[tuple, list] = {}
    for rec in records:
        lines = (rec.message or "").strip().splitlines()
        parts = _NUMBER.split(" ".join(lines[0].split()) if lines else "(no reason given)")
        entry = groups.setdefault(tuple(parts[0::2]), [0, [set() for _ in parts[1::2]]])
        entry[0] += 1
        for values, number in zip(entry[1], parts[1::2]):
            values.add(number)
    ranked = sorted(groups.items(), key=lambda item: (-item[1][0], item[0]))[:limit]
    reasons = []
    for texts, (count, numbers) in ranked:
        shown = [next(iter(values)) if len(values) == 1 else "<n>" for values in numbers]
        reasons.append(("".join(t + n for t, n in zip(texts, shown + [""])), count))
    return reasons


def _status_counts(counts: Counter) -> dict:
    entry = {"judged": sum(counts[s] for s in JUDGED)}
    entry.update({s: counts[s] for s in (*JUDGED, "unsupported")})
    return entry


def implementation_summary(records=None) -> dict[str, dict]:
    """Per implementation (report "summary"): its distinct cases, judged, a count per status, the same per
    operation, and the top unsupported reasons. ``records``: checks.RECORDS unless given."""
    by_impl = defaultdict(list)
    for rec in distinct(checks.RECORDS if records is None else records):
        by_impl[rec.implementation].append(rec)
    out = {}
    for name, recs in by_impl.items():
        counts = Counter(rec.status for rec in recs)
        entry = {"cases": len(recs), **_status_counts(counts)}
        if counts["skipped"]:
            entry["skipped"] = counts["skipped"]
        per_op: dict[str, Counter] = defaultdict(Counter)
        for rec in recs:
            per_op[rec.op][rec.status] += 1
        order = [op for op in OPERATIONS if op in per_op] + sorted(op for op in per_op if op not in OPERATIONS)
        entry["operations"] = {op: _status_counts(per_op[op]) for op in order}
        reasons = unsupported_reasons(r for r in recs if r.status == "unsupported")
        if reasons:
            entry["unsupported_reasons"] = [{"reason": reason, "count": n} for reason, n in reasons]
        out[name] = entry
    return dict(sorted(out.items()))


def _shorten(text: str, width: int = REASON_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def implementation_lines(name: str, entry: dict) -> list[str]:
    """One line of counts per implementation (judged, passed, failed, per operation), and one of its top
    unsupported reasons if it has any."""
    statuses = [f"{entry.get('passed', 0)} passed", f"{entry.get('failed', 0)} failed"]
    if entry.get("deviation"):
        statuses.append(f"{entry['deviation']} deviation")
    line = f"{name:<18} {entry['judged']} cases judged ({', '.join(statuses)})"
    operations = entry.get("operations") or {}
    if operations:
        line += " = " + " + ".join(f"{op} {counts['judged']}" for op, counts in operations.items())
    if entry.get("unsupported"):
        line += f"; {entry['unsupported']} cases unsupported"
    if entry.get("skipped"):
        line += f"; {entry['skipped']} cases skipped"
    lines = [line]
    reasons = entry.get("unsupported_reasons") or []
    if reasons:
        shown = "; ".join(f'{r["count"]} "{_shorten(r["reason"])}"' for r in reasons)
        other = entry["unsupported"] - sum(r["count"] for r in reasons)
        lines.append(f"{'':<18}   unsupported: {shown}" + (f"; {other} for other reasons" if other else ""))
    return lines


def incomplete_line(reason: str | None) -> str | None:
    """The summary's first line when the run did not go to its end."""
    if not reason:
        return None
    return (f"INCOMPLETE: {reason}; the counts below are of the cases judged before it "
            "(the report says complete: false)")


def terminal_summary(tr, config) -> None:
    from . import agreement, coverage, html_report

    entries = implementation_summary()
    stopped = incomplete_line(session.stop_reason())
    compared = baseline_lines(config)
    if not entries and not coverage.ABSENT and not (stopped and coverage.COLLECTED[0]) and not compared:
        return
    tr.section("attention conformance")
    if stopped:
        tr.write_line(stopped)
    if entries:
        tr.write_line("cases per implementation (each distinct fixture case or Hypothesis example once; "
                      "not pytest tests):")
    for name, entry in entries.items():
        for line in implementation_lines(name, entry):
            tr.write_line(line)
    # What the failures share, one line a cause, before the clauses they are filed under (root_causes.py).
    for cause in root_causes.root_causes(checks.RECORDS):
        tr.write_line(cause.line())
    # The clause that failed on the smallest case first (checks.breaks_order); each failure is
    # filed under the clause at fault, not the one its case was drawn for.
    for name, clause_ids in sorted(checks.breaks_order(checks.RECORDS).items()):
        tr.write_line(f"{name} breaks: {', '.join(clause_ids)}")
    for line in coverage.absent_lines():
        tr.write_line(line)
    for line in compared:  # --baseline: what changed since the earlier report (conformance/baseline.py)
        tr.write_line(line)
    from . import shards

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
    from . import baseline

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

# The default run stays short (issue 16: under ~80 lines when nothing fails): the most frequent reasons, then one line.
SKIP_REASONS_SHOWN = 6

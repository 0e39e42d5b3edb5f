"""The conformance counts of a run: distinct cases judged per implementation and operation, and the reasons cases
were not judged. The terminal summary (summary.py), the JSON report and a merged report print the same numbers.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict

from attention_conformance.conformance.judging.records import JUDGED, RECORDS, distinct
from attention_conformance.implementations.contract import OPERATIONS

TOP_REASONS = 3  # unsupported reasons per implementation, in the terminal and in the report's summary


REASON_WIDTH = 60  # characters of one unsupported reason in the terminal


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
    for rec in distinct(RECORDS if records is None else records):
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


_NUMBER = re.compile(r"(?<![A-Za-z_])(\d+(?:\.\d+)?(?:e[-+]?\d+)?)")

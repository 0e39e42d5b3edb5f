"""End-of-run summary in the terminal and the JSON conformance report."""
from __future__ import annotations

import gzip
import json
import platform
import re
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

from attention_conformance.implementations import _arrays as arrays

from . import checks
from .specdata import ROOT

SUITE_VERSION = "0.1.0"
REPORT_SCHEMA_VERSION = 2
JUDGED = ("passed", "failed", "deviation")  # statuses of a case the implementation ran and was judged on
TOP_REASONS = 3  # unsupported reasons per implementation, in the terminal and in the report's summary
REASON_WIDTH = 60  # characters of one unsupported reason in the terminal
_NUMBER = re.compile(r"(?<![A-Za-z_])(\d+(?:\.\d+)?(?:e[-+]?\d+)?)")


def _counts():
    per_impl: dict[str, Counter] = defaultdict(Counter)
    for rec in checks.RECORDS:
        per_impl[rec.implementation][rec.status] += 1
    return per_impl


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


def implementation_summary() -> dict[str, dict]:
    """Per implementation: cases, judged, a count per status, and the top unsupported reasons (report "summary")."""
    records = defaultdict(list)
    for rec in checks.RECORDS:
        records[rec.implementation].append(rec)
    out = {}
    for name, recs in records.items():
        counts = Counter(rec.status for rec in recs)
        entry = {"cases": len(recs), "judged": sum(counts[s] for s in JUDGED)}
        entry.update({s: counts[s] for s in (*JUDGED, "unsupported")})
        if counts["skipped"]:
            entry["skipped"] = counts["skipped"]
        reasons = unsupported_reasons(r for r in recs if r.status == "unsupported")
        if reasons:
            entry["unsupported_reasons"] = [{"reason": reason, "count": n} for reason, n in reasons]
        out[name] = entry
    return dict(sorted(out.items()))


def _shorten(text: str, width: int = REASON_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def implementation_lines(name: str, entry: dict) -> list[str]:
    """One line of counts per implementation, and one of its top unsupported reasons if it has any."""
    judged = ", ".join(f"{entry[s]} {s}" for s in JUDGED if entry.get(s))
    line = f"{name:<18} {entry['judged']} cases judged" + (f" ({judged})" if judged else "")
    if entry.get("unsupported"):
        line += f", {entry['unsupported']} cases unsupported"
    if entry.get("skipped"):
        line += f", {entry['skipped']} cases skipped"
    lines = [line]
    reasons = entry.get("unsupported_reasons") or []
    if reasons:
        shown = "; ".join(f'{r["count"]} "{_shorten(r["reason"])}"' for r in reasons)
        other = entry["unsupported"] - sum(r["count"] for r in reasons)
        lines.append(f"{'':<18}   unsupported: {shown}" + (f"; {other} for other reasons" if other else ""))
    return lines


def terminal_summary(tr, config) -> None:
    from . import agreement, coverage

    per_impl = _counts()
    if not per_impl and not coverage.ABSENT:
        return
    tr.section("attention conformance")
    if per_impl:
        tr.write_line("cases per implementation (a fixture case or a Hypothesis example each; not pytest tests):")
    for name, entry in sorted(implementation_summary().items()):
        for line in implementation_lines(name, entry):
            tr.write_line(line)
    # The clause that failed on the smallest case first (checks.breaks_order); each failure is
    # filed under the clause at fault, not the one its case was drawn for.
    for name, clause_ids in sorted(checks.breaks_order(checks.RECORDS).items()):
        tr.write_line(f"{name} breaks: {', '.join(clause_ids)}")
    for line in coverage.absent_lines():
        tr.write_line(line)
    skipped_lines(tr)

    pairs = len(agreement.matrix())
    if pairs:
        tr.write_line(f"cross-backend agreement ({pairs} pairs of implementations on shared cases, in ULPs): "
                      "in the report's agreement matrix (--conformance-report)")
    path = config.getoption("conformance_report", None)
    if path:
        tr.write_line(f"conformance report: {path} and {Path(path).with_suffix('').with_suffix('.html')}")


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


SUITE_MODULES = ("ml_dtypes", "hypothesis", "pytest")  # the suite's own dependencies; frameworks come from adapters


def _framework_versions() -> dict[str, str | None]:
    """Python, each registered array framework (its adapter's version probe) and the suite's dependencies."""
    versions = {"python": platform.python_version(), **arrays.framework_versions()}
    versions.update({name: arrays.module_version(name) for name in SUITE_MODULES})
    return versions


def _device_info() -> dict:
    """cpu: the processor; then what each array adapter reports of its started devices (cuda: torch's GPUs,
    jax: JAX's devices). Nothing is imported or started for this: a framework the process never loaded (or
    JAX with no backend initialised) adds nothing.
    """
    info: dict = {"cpu": platform.processor() or platform.machine(), **arrays.device_info()}
    return {key: value for key, value in info.items() if value}


def local_environment() -> dict:
    """This process's versions and devices: what an xdist worker sends the controller (plugin.send_to_controller).

    Plain str, list and dict only (execnet refuses other types, and the whole workeroutput with them).
    """
    devices = {kind: str(v) if isinstance(v, str) else [str(x) for x in v] for kind, v in _device_info().items()}
    return {"versions": _framework_versions(), "devices": devices}


# What the xdist workers reported (plugin.receive_from_worker merges each into it); empty without xdist.
WORKER_ENVIRONMENT: dict = {"versions": {}, "devices": {}}


def _merge_environment(into: dict, env: dict) -> None:
    """Merge ``env`` into ``into``: the first non-null version and device name win; device lists are united."""
    for name, version in (env.get("versions") or {}).items():
        if version and not into["versions"].get(name):
            into["versions"][name] = version
        into["versions"].setdefault(name, None)
    for kind, names in (env.get("devices") or {}).items():
        if isinstance(names, str):
            into["devices"].setdefault(kind, names)
        elif names:
            known = into["devices"].setdefault(kind, [])
            known[:] = sorted(set(known) | set(names))


def merge_worker_environment(env: dict) -> None:
    """The controller merges one worker's ``local_environment()`` into WORKER_ENVIRONMENT."""
    _merge_environment(WORKER_ENVIRONMENT, env or {})


def environment() -> dict:
    """The report's environment: this process's versions and devices, completed and united with the workers'."""
    merged: dict = {"versions": {}, "devices": {}}
    _merge_environment(merged, local_environment())
    _merge_environment(merged, WORKER_ENVIRONMENT)
    return {**merged, "platform": platform.platform()}


def _commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def build_report(config, exitstatus) -> dict:
    from . import agreement, coverage, plugin

    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "suite": {"name": "attention-conformance", "version": SUITE_VERSION, "commit": _commit()},
        "exit_status": int(exitstatus),
        "environment": environment(),
        "implementations": [impl.describe() for impl in plugin.implementations(config)],
        "summary": implementation_summary(),
        "coverage": config.stash.get(coverage.PROBLEMS_KEY, []),
        "cases": _case_dicts(checks.RECORDS),
        "agreement": agreement.matrix(),
    }


def _case_dicts(records) -> list[dict]:
    """Every record, compacted (CaseRecord.as_dict); a failure's repro is kept in the last record of its group.

    Hypothesis records every failing example it tries while shrinking and replays
    the smallest last, so of the failures of one implementation, test, clause, op,
    device and dtype only the last carries the repro snippet (the one the terminal
    showed); the others keep their verdict, problem and worst element.
    """
    last = {}
    for index, rec in enumerate(records):
        if rec.status == "failed":
            last[(rec.implementation, rec.test, rec.clause, rec.op, rec.device, rec.dtype)] = index
    keep = set(last.values())
    return [rec.as_dict(repro=rec.status != "failed" or index in keep) for index, rec in enumerate(records)]


def dumps(report: dict) -> str:
    """Compact JSON: no indentation, one line per top-level field and per case record (easy to grep and diff)."""
    def one(value) -> str:
        return json.dumps(value, separators=(",", ":"), default=float)

    fields = []
    for key, value in report.items():
        if key == "cases" and value:
            text = "[\n" + ",\n".join(one(case) for case in value) + "\n]"
        else:
            text = one(value)
        fields.append(f"{one(key)}:{text}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def html_path(path: Path) -> Path:
    """The HTML page beside the report: reports/c.json and reports/c.json.gz both give reports/c.html."""
    path = Path(path)
    return (path.with_suffix("") if path.suffix == ".gz" else path).with_suffix(".html")


def write_report(config, path: str, exitstatus) -> None:
    """Write the JSON report to ``path`` (gzip-compressed when it ends in .gz) and the HTML page beside it."""
    report = build_report(config, exitstatus)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = dumps(report).encode("utf-8")
    target.write_bytes(gzip.compress(data, mtime=0) if target.suffix == ".gz" else data)
    from . import html_report

    html_report.write(report, html_path(target))

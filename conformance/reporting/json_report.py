"""The JSON conformance report (`--conformance-report PATH`, docs/report.md, docs/report-schema.json) and the HTML
page beside it (conformance/reporting/html_report.py)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

from attention_conformance.conformance.harness import session
from attention_conformance.conformance.judging import agreement, evidence
from attention_conformance.conformance.judging.records import RECORDS, distinct
from attention_conformance.conformance.reporting import counts, coverage, environment, provenance, root_causes, shards
from attention_conformance.conformance.specdata import ROOT

SUITE_VERSION = "0.1.0"


REPORT_SCHEMA_VERSION = 3


def _commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def build_report(config, exitstatus) -> dict:
    reason = session.stop_reason(detailed=True)
    report = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "suite": {"name": "attention-conformance", "version": SUITE_VERSION, "commit": _commit(),
                  "spec_hash": provenance.spec_hash()},
        "exit_status": int(exitstatus),
        "complete": reason is None,
    }
    if reason:
        report["incomplete_reason"] = reason
    shard, deferred = shards.report_field(config), coverage.deferred_rule(config)
    report.update({
        "environment": _environment(config),
        **({"shard": shard} if shard else {}),
        "implementations": [{**impl.describe(), "version": provenance.implementation_version(impl)}
                            for impl in session.implementations(config)],
        "summary": counts.implementation_summary(),
        "causes": [cause.as_dict() for cause in root_causes.root_causes(RECORDS)],
        "coverage": config.stash.get(coverage.PROBLEMS_KEY, []),
        **({"coverage_rule": deferred} if deferred else {}),
        "cases": _case_dicts(distinct(RECORDS)),
        "agreement": agreement.matrix(),
        "durations": {nodeid: round(seconds, 3) for nodeid, seconds in sorted(shards.DURATIONS.items())},
    })
    saved = evidence.directory()
    if saved is not None and any(rec.repro_id for rec in RECORDS):
        report["repro_directory"] = _relative_to_report(saved, config)
    return report


def _relative_to_report(directory: Path, config) -> str:
    """The repro directory as the report names it: relative to the report's own directory when beside it."""
    report = Path(str(config.invocation_params.dir)) / config.getoption("conformance_report")
    try:
        return str(directory.relative_to(report.resolve().parent))
    except ValueError:
        return str(directory)


def _environment(config) -> dict:
    """The run's environment, with what makes it comparable across runners (conformance/reporting/provenance.py): the
    installed framework versions, the OS and architecture, and --environment-label."""
    env = {**environment.environment(), "installed": provenance.installed_versions(), "machine": provenance.machine()}
    label = config.getoption("environment_label", None)
    if label:
        env["label"] = label
    return env


def _case_dicts(records) -> list[dict]:
    """Every record, compacted (CaseRecord.as_dict); a failure's repro is kept in the last record of its group.

    Hypothesis records every failing example it tries while shrinking and replays
    the smallest last, so of the failures of one implementation, test, clause, op,
    device and dtype only the last carries the repro command (the one the terminal
    showed); the others keep their verdict, problem and worst element.
    """
    last = {}
    for index, rec in enumerate(records):
        if rec.status == "failed":
            last[(rec.implementation, rec.test, rec.clause, rec.op, rec.device, rec.dtype)] = index
    keep = set(last.values())
    return [rec.as_dict(repro=rec.status != "failed" or index in keep) for index, rec in enumerate(records)]


def dumps(report: dict) -> str:
    """Compact JSON: no indentation, one line per top-level field, per case record and per cell of a merged
    report's matrix (easy to grep and diff)."""
    def one(value) -> str:
        return json.dumps(value, separators=(",", ":"), default=float)

    def lines(items: list) -> str:
        return "[\n" + ",\n".join(one(item) for item in items) + "\n]" if items else "[]"

    fields = []
    for key, value in report.items():
        if key in LINE_PER_ITEM and isinstance(value, list):
            text = lines(value)
        elif key in LINE_PER_ITEM and isinstance(value, dict):  # a merged report's cases, per environment
            text = "{\n" + ",\n".join(f"{one(env)}:{lines(items)}" for env, items in value.items()) + "\n}"
        else:
            text = one(value)
        fields.append(f"{one(key)}:{text}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


LINE_PER_ITEM = ("cases", "matrix")


def _write_whole(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` through a temporary file beside it: a run killed while writing leaves the
    previous file or none, never half of one."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, target)


def write_json(target: Path, report: dict) -> None:
    """Write ``report`` to ``target``, whole or not at all, gzip-compressed when the name ends in .gz."""
    data = dumps(report).encode("utf-8")
    _write_whole(target, gzip.compress(data, mtime=0) if target.suffix == ".gz" else data)


def write_report(config, path: str, exitstatus, report: dict | None = None) -> None:
    """Write the JSON report to ``path`` (gzip-compressed when it ends in .gz) and the HTML page beside it;
    ``report``: the one already built (to compare with a baseline), else built now."""
    from attention_conformance.conformance.reporting import html_report

    report = build_report(config, exitstatus) if report is None else report
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json(target, report)
    html_report.write(report, html_report.html_path(target))

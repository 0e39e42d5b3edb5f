"""`attention-conformance merge REPORT... -o combined.json`: the reports of several runners as one matrix.

A CI runs the suite on several runners (a CPU job, GPU jobs of several kinds, several framework versions) and may
split one run across N runners (``--shard I/N``, conformance/reporting/shards.py). Each writes its own JSON report; this
module reads them and writes one merged report (docs/report.md, "The merged report"; its schema is the ``merged``
branch of docs/report-schema.json) and its HTML page (conformance/reporting/merged_html.py):

1. **Shards become one run.** Reports written with ``--shard`` are grouped by their run: the same shard count,
   selection digest, suite, spec, label, Python, OS and installed framework versions. A group must have each index
   once and one plan (the same durations file); a missing shard leaves the run incomplete, two reports of one index
   or two plans are an error. The shards' environments are united as an xdist controller unites its workers'.
2. **Runs are kept apart by environment.** Each run's environment key (conformance/reporting/provenance.py: label,
Python,
   OS and architecture, installed framework versions, accelerator models) names a column set ``E1``, ``E2``, ...;
   runs of one key are one environment (a case both judged counts once, ``records.distinct``), runs of different
   keys are never summed into one cell.
3. **One matrix:** a cell per environment x implementation x device x clause with its judged, passed, failed,
   deviation and unsupported counts and the indices of its failed cases in ``cases[environment]``.
4. **The coverage rule of split runs.** A shard cannot apply rules 1 and 3 alone (conformance/reporting/coverage.py);
the
   merge applies them to the cases of all shards of a complete run, with the floor the shards were given.

Everything is ordered canonically (environments by key, cases by implementation, device, clause, test, case,
dtype, status), so the merge of a run's N shard reports equals the merge of the same run unsplit, ``runs`` (which
report came from where) aside (tests/test_runners.py checks it).

Exit status of the command: 0 merged; 1 merged, but the whole is not a verdict: a split run misses shards, or
the coverage rule applied here fails (``--allow-unjudged`` given to the shards reports it only); with
``--fail-on-regression``, also 1 when something broke since ``--baseline``; 2 a report could not be read or
merged (the message names the file).
"""
from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from attention_conformance.conformance.judging.records import JUDGED, CaseRecord, distinct
from attention_conformance.conformance.reporting import counts, coverage, environment, root_causes
from attention_conformance.conformance.reporting.provenance import describe_key, digest, environment_key
from attention_conformance.implementations import contract

KIND = "merged"


STATUS_FIELDS = ("judged", "passed", "failed", "deviation", "unsupported")


class MergeError(Exception):
    """Reports that cannot be merged; the message names the file(s)."""


# ------------------------------------------------------------------ reading
def read_report(path: Path | str) -> dict:
    """A JSON report (gzip-compressed when it ends in .gz), checked to be one of this suite's."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    except (OSError, ValueError, EOFError) as exc:
        raise MergeError(f"{path}: cannot read it as a JSON report: {exc}") from None
    suite = data.get("suite") if isinstance(data, dict) else None
    if not isinstance(suite, dict) or suite.get("name") != "attention-conformance" or "cases" not in data:
        raise MergeError(f"{path}: not an attention-conformance report (no suite.name 'attention-conformance' "
                         "or no cases)")
    return data


def _legacy_ops(cases: list[dict]):
    """For a report written before every record carried its op (a passed record had none): the op of a record, from
    its fixture (a fixture case's label is its id), else the op the records of the same test function name, else the
    first operation its clause binds. A guess: an environment of one such report keeps the report's own summary."""
    from attention_conformance.conformance.cases.fixtures import fixtures
    from attention_conformance.conformance.specdata import clauses

    try:
        by_fixture, by_clause = {fx.id: fx.op for fx in fixtures()}, {cid: c.binds for cid, c in clauses().items()}
    except Exception:  # spec/ unreadable: the per-operation counts of such records are then left empty
        by_fixture, by_clause = {}, {}
    by_test: dict[str, Counter] = defaultdict(Counter)
    for case in cases:
        if case.get("op"):
            by_test[case.get("test", "").split("[", 1)[0]][case["op"]] += 1

    def op_of(case: dict) -> str:
        test = by_test.get(case.get("test", "").split("[", 1)[0])
        binds = [op for op in by_clause.get(case["clause"], ()) if op in contract.OPERATIONS]
        return (by_fixture.get(case.get("case", "")) or (test.most_common(1)[0][0] if test else "")
                or (binds[0] if binds else "sdpa"))

    return op_of


def records_of(report: dict) -> list[CaseRecord]:
    cases = report.get("cases") or []
    op_of = _legacy_ops(cases) if any("op" not in case for case in cases) else None
    return [CaseRecord.from_report(case, op=op_of(case) if op_of and "op" not in case else "") for case in cases]


# ------------------------------------------------------------------ runs
@dataclass
class Run:
    """One run: a report, or the N shard reports of a split run."""

    sources: list[str]
    reports: list[dict]
    shard_count: int | None = None
    missing: list[int] = field(default_factory=list)

    @property
    def environment(self) -> dict:
        return environment.united([report.get("environment") or {} for report in self.reports])

    @property
    def complete(self) -> bool:
        return not self.missing and all(report.get("complete", True) for report in self.reports)

    def incomplete_reasons(self) -> list[str]:
        reasons = []
        if self.missing:
            reasons.append(f"shard(s) {', '.join(map(str, self.missing))} of {self.shard_count} missing")
        for source, report in zip(self.sources, self.reports):
            if not report.get("complete", True):
                reasons.append(f"{source}: {report.get('incomplete_reason') or 'stopped early'}")
        return reasons


def _run_of_shard(report: dict) -> str:
    """What the shards of one run share (everything but the accelerators, which a shard that ran no framework
    code cannot name)."""
    shard = report["shard"]
    suite = report.get("suite") or {}
    key = environment_key(report.get("environment") or {})
    key.pop("accelerators")
    return digest([shard.get("count"), shard.get("selection"), suite.get("version"), suite.get("commit"),
                   suite.get("spec_hash"), key])


def group_runs(sources: list[str], reports: list[dict]) -> list[Run]:
    """Unsplit reports as runs of their own; shard reports grouped into their runs, checked whole and consistent."""
    runs: list[Run] = []
    shards: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    for source, report in zip(sources, reports):
        if report.get("kind") == KIND:
            raise MergeError(f"{source}: a merged report; merge the runners' own reports")
        if report.get("shard"):
            shards[_run_of_shard(report)].append((source, report))
        else:
            runs.append(Run([source], [report]))
    for members in shards.values():
        count = members[0][1]["shard"]["count"]
        by_index: dict[int, tuple[str, dict]] = {}
        for source, report in members:
            index = report["shard"]["index"]
            if index in by_index:
                raise MergeError(f"{by_index[index][0]} and {source} are both shard {index}/{count} of one run")
            by_index[index] = (source, report)
        plans = {report["shard"].get("plan") for _, report in members}
        if len(plans) > 1:
            raise MergeError("the shards of one run were split by different plans (different --shard-durations "
                             "files?), so some items ran twice and others never: "
                             + ", ".join(f"{s} ({r['shard'].get('balanced_by')})" for s, r in members))
        ordered = [by_index[i] for i in sorted(by_index)]
        runs.append(Run([s for s, _ in ordered], [r for _, r in ordered], count,
                        [i for i in range(1, count + 1) if i not in by_index]))
    return runs


# ------------------------------------------------------------------ the merged report
def _case_order(rec: CaseRecord) -> tuple:
    return (rec.implementation, rec.device, rec.clause, rec.test, rec.case, rec.dtype, rec.status, rec.op)


def _matrix(env_id: str, cases: list[dict]) -> list[dict]:
    cells: dict[tuple, dict] = {}
    for index, case in enumerate(cases):
        key = (case["implementation"], case["device"], case["clause"])
        cell = cells.setdefault(key, {"implementation": key[0], "device": key[1], "environment": env_id,
                                      "clause": key[2], **{name: 0 for name in STATUS_FIELDS}, "failures": []})
        status = case["status"]
        if status in cell:
            cell[status] += 1
        cell["judged"] += status in JUDGED
        if status == "failed":
            cell["failures"].append(index)
    return [cells[key] for key in sorted(cells)]


def _agreement(runs: list[Run]) -> list[dict]:
    """The shards of a run compared disjoint fixture cases (their rows add up); separate runs of one environment
    may have compared the same (the larger row is kept)."""
    best: dict[tuple, dict] = {}
    for run in runs:
        summed: dict[tuple, dict] = {}
        for report in run.reports:
            for row in report.get("agreement") or []:
                key = (row["dtype"], row["a"], row["b"])
                into = summed.setdefault(key, {**row, "cases": 0, "max_abs_diff": 0.0, "max_ulp": 0})
                into["cases"] += row["cases"]
                into["max_abs_diff"] = max(into["max_abs_diff"], row["max_abs_diff"])
                into["max_ulp"] = max(into["max_ulp"], row["max_ulp"])
        for key, row in summed.items():
            if key not in best or (row["cases"], row["max_ulp"]) > (best[key]["cases"], best[key]["max_ulp"]):
                best[key] = row
    return [best[key] for key in sorted(best)]


def _implementations(runs: list[Run]) -> list[dict]:
    found: dict[str, dict] = {}
    for run in runs:
        for report in run.reports:
            for described in report.get("implementations") or []:
                found.setdefault(described["name"], described)
    return [found[name] for name in sorted(found)]


def _coverage(env_id: str, runs: list[Run]) -> list[dict]:
    """The runs' own coverage lines, and the rules a split run left to the merge, applied to its shards' cases."""
    lines: list[dict] = []
    seen = set()
    for run in runs:
        for report in run.reports:
            for line in report.get("coverage") or []:
                if line not in seen:  # every shard of a run finds the same rule-2 lines
                    seen.add(line)
                    lines.append({"environment": env_id, "line": line, "applied_by": "run", "fails": False})
        rule = run.reports[0].get("coverage_rule")
        if not rule or not run.complete:  # an incomplete run is not held to the rule (as an interrupted one)
            continue
        run_records = [rec for report in run.reports for rec in records_of(report)]
        names = sorted({name for name, _ in rule["runnable"]})
        found = coverage.floor_problems(names, {tuple(pair) for pair in rule["runnable"]}, run_records,
                                        rule["min_judged"], rule["collected"])
        lines.extend({"environment": env_id, "line": line, "applied_by": "merge", "fails": not rule["allow_unjudged"]}
                     for line in found)
    return lines


def merge(sources: list[str], reports: list[dict]) -> dict:
    """The merged report of ``reports`` (read from ``sources``)."""
    if not reports:
        raise MergeError("no report to merge")
    runs = group_runs(sources, reports)
    keyed: dict[str, tuple[dict, list[Run]]] = {}
    for run in runs:
        key = environment_key(run.environment)
        keyed.setdefault(json.dumps(key, sort_keys=True), (key, []))[1].append(run)
    ordered = sorted(keyed.values(), key=lambda item: (describe_key(item[0]), json.dumps(item[0], sort_keys=True)))
    merged: dict = {
        "kind": KIND, "schema_version": reports[0].get("schema_version"), "suite": reports[0]["suite"],
        "exit_status": max(int(report.get("exit_status", 0)) for report in reports), "complete": True,
        "runs": [], "environments": {}, "matrix": [], "implementations": {}, "summary": {}, "causes": {},
        "coverage": [], "cases": {}, "agreement": {},
    }
    reasons = []
    for number, (key, env_runs) in enumerate(ordered, start=1):
        env_id = f"E{number}"
        records = sorted(distinct(rec for run in env_runs for report in run.reports for rec in records_of(report)),
                         key=_case_order)
        cases = [rec.as_dict() for rec in records]
        env_reasons = [reason for run in env_runs for reason in run.incomplete_reasons()]
        reasons += [f"{env_id}: {reason}" for reason in env_reasons]
        merged["environments"][env_id] = {
            "description": describe_key(key) or "(no framework imported)", "key": key,
            "environment": environment.united([run.environment for run in env_runs]),
            "complete": not env_reasons, **({"incomplete_reason": "; ".join(env_reasons)} if env_reasons else {}),
            "missing_shards": [f"{index}/{run.shard_count}" for run in env_runs for index in run.missing],
        }
        for run in env_runs:
            for source, report in zip(run.sources, run.reports):
                entry = {"source": source, "environment": env_id, "suite": report["suite"],
                         "exit_status": int(report.get("exit_status", 0)),
                         "complete": bool(report.get("complete", True)),
                         "cases": len(report.get("cases") or [])}
                if report.get("shard"):
                    entry["shard"] = {"index": report["shard"]["index"], "count": report["shard"]["count"]}
                merged["runs"].append(entry)
        merged["matrix"] += _matrix(env_id, cases)
        merged["implementations"][env_id] = _implementations(env_runs)
        reports_here = [report for run in env_runs for report in run.reports]
        legacy = any("op" not in case for report in reports_here for case in report.get("cases") or [])
        merged["summary"][env_id] = (reports_here[0]["summary"] if legacy and len(reports_here) == 1
                                     else counts.implementation_summary(records))
        merged["causes"][env_id] = [cause.as_dict() for cause in root_causes.root_causes(records)]
        merged["coverage"] += _coverage(env_id, env_runs)
        merged["cases"][env_id] = cases
        merged["agreement"][env_id] = _agreement(env_runs)
    merged["complete"] = not reasons
    if reasons:
        merged["incomplete_reason"] = "; ".join(reasons)
    return merged


def verdicts(merged: dict) -> dict:
    """A merged report without where its parts came from (``runs``, and each environment's united process
    details): what the merge of a run's shards must share with the merge of that run unsplit."""
    out = {key: value for key, value in merged.items() if key != "runs"}
    out["environments"] = {env_id: {k: v for k, v in env.items() if k != "environment"}
                           for env_id, env in merged["environments"].items()}
    return out


def missing_shards(merged: dict) -> list[str]:
    """``E1 2/4`` for each shard of a split run that no report stands for."""
    return [f"{env_id} {shard}" for env_id, env in merged["environments"].items() for shard in env["missing_shards"]]


def durations(reports: list[dict]) -> dict[str, float]:
    """Every item's measured seconds in the reports (``durations``), for ``--shard-durations`` of the next run."""
    found: dict[str, float] = {}
    for report in reports:
        found.update(report.get("durations") or {})
    return found


# ------------------------------------------------------------------ the command
def terminal_lines(merged: dict) -> list[str]:
    """What the command prints: the environments, each implementation's counts and broken clauses, coverage and
    what is missing."""
    lines = [f"merged {len(merged['runs'])} report(s) into {len(merged['environments'])} environment(s):"]
    for env_id, env in merged["environments"].items():
        runs = [run for run in merged["runs"] if run["environment"] == env_id]
        shards = sorted(f"{run['shard']['index']}/{run['shard']['count']}" for run in runs if "shard" in run)
        lines.append(f"  {env_id}  {env['description']} ({len(runs)} report(s)"
                     + (f"; shards {', '.join(shards)}" if shards else "") + ")")
    for env_id, entries in merged["summary"].items():
        for name, entry in entries.items():
            for line in counts.implementation_lines(f"{env_id} {name}", entry):
                lines.append(line)
    broken: dict[tuple, list[str]] = defaultdict(list)
    for cell in merged["matrix"]:
        if cell["failed"]:
            broken[(cell["environment"], cell["implementation"], cell["device"])].append(cell["clause"])
    for (env_id, name, device), clause_ids in sorted(broken.items()):
        lines.append(f"{env_id} {name} on {device} breaks: {', '.join(clause_ids)}")
    for entry in merged["coverage"]:
        lines.append(f"COVERAGE ({'applied by the merge' if entry['applied_by'] == 'merge' else 'in the run'}): "
                     f"{entry['environment']}: {entry['line']}")
    if not merged["complete"]:
        lines.append(f"INCOMPLETE: {merged['incomplete_reason']}")
    return lines


def exit_status(merged: dict) -> int:
    """1 where the coverage rule fails or a shard's report is missing; 2 where a report says its run stopped early
    (interrupted, as that run's own exit status says: the rule could not be applied to it, so the gate cannot pass
    it); else 0. Failures are the runners' own exit statuses, not the merge's."""
    if missing_shards(merged) or any(entry["fails"] for entry in merged["coverage"]):
        return 1
    return 0 if merged["complete"] else 2

"""``--baseline OLD.json``: this run compared with an earlier report: what broke, what was fixed, which declared
deviations appeared or went, per implementation and device (and environment, for merged reports).

Both sides are read as merged reports (conformance/reporting/merge.py; a runner's report is a merged report of one
environment), and compared cell by cell: environment x implementation x device x clause.

* **newly broken**: the cell has failed cases now and had none in the baseline (or was not in it);
* **fixed**: it had failed cases in the baseline and now judged cases without a failure;
* **deviation added / gone**: declared deviations now and none before / before and none now, among judged cases;
* cells judged on one side only are counted (a run of fewer tests judges fewer clauses: not a change).

Environments are paired by their key (conformance/reporting/provenance.py); what is left is paired by
``--environment-label``,
and a run of one environment with a baseline of one is paired whatever changed (a torch upgrade is exactly what
one wants compared), the change listed. An environment the baseline lacks is compared with nothing: its failed
cells are newly broken.

The exit status is unchanged, unless ``--fail-on-regression``: then a newly broken cell fails the run (exit 1), and
a run whose only failures are conformance failures of cells already broken in the baseline passes (exit 0): only
new breakage fails. Errors, interruptions and coverage violations keep their status.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from attention_conformance.conformance.reporting.merge import KIND, MergeError, merge, read_report

RESULT_KEY = pytest.StashKey[dict]()  # the comparison, for the terminal summary


BASELINE_KEY = pytest.StashKey[tuple]()  # (path, report) read at configure


LINES_PER_KIND = 12  # cells listed per kind in the terminal; the report lists all


VERDICT_FAILURES: set[str] = set()  # items failed by verdicts alone (the controller sees every worker's reports)


OTHER_FAILURES: set[str] = set()  # items failed otherwise: an error in setup, a crash, a time limit


class BaselineError(Exception):
    """A baseline that cannot be read; the message names the file."""


def read(path: str | Path) -> dict:
    try:
        return read_report(path)
    except MergeError as exc:
        raise BaselineError(f"--baseline {exc}") from None


def load(config) -> None:
    """At configure (the controller or the only process): read --baseline now, so a wrong path stops the run at
    once rather than after it."""
    path = config.getoption("baseline", None)
    if config.getoption("fail_on_regression", False) and not path:
        raise pytest.UsageError("--fail-on-regression needs --baseline OLD.json")
    if path:
        try:
            config.stash[BASELINE_KEY] = (path, read(path))
        except BaselineError as exc:
            raise pytest.UsageError(str(exc)) from None


def is_verdict(error) -> bool:
    """A verdict against the implementation (ConformanceFailure), or a group of them (Hypothesis raises the distinct
    failures of one test as a group)."""
    from attention_conformance.conformance.judging.messages import ConformanceFailure

    inner = getattr(error, "exceptions", None)
    return isinstance(error, ConformanceFailure) or bool(inner) and all(is_verdict(e) for e in inner)


def mark_verdict(report, call) -> None:
    """pytest_runtest_makereport, where the item ran: mark a failed report whose exception is a verdict (the mark
    travels to the xdist controller with the report)."""
    if report.failed and call.excinfo is not None and is_verdict(call.excinfo.value):
        report.conformance_verdict = True


def note_outcome(report) -> None:
    """pytest_runtest_logreport: which items failed, by verdicts alone or otherwise."""
    if report.failed:
        verdict = report.when == "call" and getattr(report, "conformance_verdict", False)
        (VERDICT_FAILURES if verdict else OTHER_FAILURES).add(report.nodeid)


# ------------------------------------------------------------------ the comparison
def _as_merged(report: dict, source: str) -> dict:
    return report if report.get("kind") == KIND else merge([source], [report])


def _pair(new: dict, old: dict) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(this side's environment, the baseline's paired with it or None), and the baseline's left unpaired: by equal
    key, then by a label one environment on each side has, then the only one left on each side."""
    new_envs, old_envs = new["environments"], old["environments"]
    pairs: dict[str, str] = {}
    free = list(old_envs)

    def unpaired_new() -> list[str]:
        return [env_id for env_id in new_envs if env_id not in pairs]

    def label(envs: dict, env_id: str) -> str:
        return envs[env_id]["key"]["label"]

    rules = (
        lambda env_id: [o for o in free if old_envs[o]["key"] == new_envs[env_id]["key"]],
        lambda env_id: [o for o in free if label(old_envs, o) == label(new_envs, env_id)]
        if sum(label(new_envs, n) == label(new_envs, env_id) for n in unpaired_new()) == 1 else [],
        lambda env_id: list(free) if len(unpaired_new()) == 1 else [],
    )
    for rule in rules:
        for env_id in unpaired_new():
            found = rule(env_id)
            if len(found) == 1:  # keys are unique on each side: the first rule finds one at most
                pairs[env_id] = found[0]
                free.remove(found[0])
    return [(env_id, pairs.get(env_id)) for env_id in new_envs], free


def _cells(merged: dict) -> dict[str, dict[tuple, dict]]:
    cells: dict[str, dict[tuple, dict]] = defaultdict(dict)
    for cell in merged["matrix"]:
        cells[cell["environment"]][(cell["implementation"], cell["device"], cell["clause"])] = cell
    return cells


def _changes(new_env: dict, old_env: dict) -> list[str]:
    """What differs between two paired environments and their implementations: versions, label, Python."""
    changes = []
    new_key, old_key = new_env["key"], old_env["key"]
    for name in sorted(set(new_key["versions"]) | set(old_key["versions"])):
        before, after = old_key["versions"].get(name), new_key["versions"].get(name)
        if before != after:
            changes.append(f"{name} {before or '(absent)'} -> {after or '(absent)'}")
    for field in ("python", "machine", "label"):
        if new_key.get(field) != old_key.get(field):
            changes.append(f"{field} {old_key.get(field) or '(none)'} -> {new_key.get(field) or '(none)'}")
    if new_key["accelerators"] != old_key["accelerators"]:
        changes.append(f"accelerators {', '.join(old_key['accelerators']) or '(none)'} -> "
                       f"{', '.join(new_key['accelerators']) or '(none)'}")
    return changes


def _implementation_changes(new_list: list[dict], old_list: list[dict]) -> list[str]:
    before = {d["name"]: d for d in old_list}
    changes = []
    for described in new_list:
        earlier = before.get(described["name"])
        if earlier and earlier.get("version") != described.get("version"):
            changes.append(f"{described['name']} {earlier.get('version') or '(no version)'} -> "
                           f"{described.get('version') or '(no version)'}")
    return changes


def _counts(cell: dict | None) -> dict | None:
    return None if cell is None else {k: cell[k] for k in ("judged", "failed", "deviation")}


def compare(new_report: dict, old_report: dict, source: str) -> dict:
    """The report's ``baseline`` section: ``new_report`` (a run's or a merged one) against ``old_report``."""
    new, old = _as_merged(new_report, "this run"), _as_merged(old_report, source)
    pairs, unpaired_old = _pair(new, old)
    new_cells, old_cells = _cells(new), _cells(old)
    result: dict = {
        "source": source, "suite": old["suite"],
        "same_spec": (old["suite"].get("spec_hash") == new["suite"].get("spec_hash")
                      if old["suite"].get("spec_hash") and new["suite"].get("spec_hash") else None),
        "environments": [], "newly_broken": [], "fixed": [], "deviations_added": [], "deviations_gone": [],
        "judged_only_now": 0, "judged_only_before": 0,
    }
    for env_id, old_id in pairs:
        now, before = new_cells.get(env_id, {}), old_cells.get(old_id, {}) if old_id else {}
        entry = {"environment": env_id, "baseline_environment": old_id, "changes": []}
        if old_id:
            entry["changes"] = _changes(new["environments"][env_id], old["environments"][old_id]) + \
                _implementation_changes(new["implementations"].get(env_id, []), old["implementations"].get(old_id, []))
        result["environments"].append(entry)
        for key in sorted(set(now) | set(before)):
            cell, earlier = now.get(key), before.get(key)
            judged_now, judged_before = bool(cell and cell["judged"]), bool(earlier and earlier["judged"])
            row = {"environment": env_id, "implementation": key[0], "device": key[1], "clause": key[2],
                   **(_counts(cell) or {"judged": 0, "failed": 0, "deviation": 0}), "baseline": _counts(earlier)}
            if judged_now and cell["failed"] and not (earlier and earlier["failed"]):
                result["newly_broken"].append(row)
            if judged_now and not cell["failed"] and earlier and earlier["failed"]:
                result["fixed"].append(row)
            if judged_now and cell["deviation"] and not (earlier and earlier["deviation"]):
                result["deviations_added"].append(row)
            if judged_now and not cell["deviation"] and earlier and earlier["deviation"]:
                result["deviations_gone"].append(row)
            result["judged_only_now"] += judged_now and not judged_before
            result["judged_only_before"] += judged_before and not judged_now
    result["baseline_environments_unpaired"] = [
        {"environment": old_id, "description": old["environments"][old_id]["description"]} for old_id in unpaired_old]
    result["no_change"] = not any(result[k] for k in ("newly_broken", "fixed", "deviations_added", "deviations_gone"))
    return result


# ------------------------------------------------------------------ the run's side
def compare_run(config, pytest_session, report: dict) -> None:
    """At the end of a run with --baseline: compare, keep the result for the summary and the report, and with
    --fail-on-regression let only new breakage decide a failing exit status."""
    path, old = config.stash[BASELINE_KEY]
    result = compare(report, old, str(path))
    config.stash[RESULT_KEY] = result
    report["baseline"] = result
    if config.getoption("fail_on_regression", False):
        pytest_session.exitstatus = regression_status(pytest_session.exitstatus, result, config)
        report["exit_status"] = int(pytest_session.exitstatus)


def regression_status(exitstatus, result: dict, config) -> int:
    """The exit status under --fail-on-regression: 1 on new breakage; 0 for a run whose failures are all
    conformance failures of cells already broken in the baseline; otherwise unchanged."""
    from attention_conformance.conformance.reporting import coverage

    if result["newly_broken"]:
        return pytest.ExitCode.TESTS_FAILED if exitstatus == pytest.ExitCode.OK else exitstatus
    if exitstatus != pytest.ExitCode.TESTS_FAILED or OTHER_FAILURES or not VERDICT_FAILURES:
        return exitstatus
    if config.stash.get(coverage.PROBLEMS_KEY, []) and not config.getoption("allow_unjudged", False):
        return exitstatus
    # Every failed item failed by verdicts, each filed in a cell; none is newly broken, so each was broken before.
    return pytest.ExitCode.OK


# ------------------------------------------------------------------ the terminal
def _where(row: dict, several: bool) -> str:
    return f"{row['environment'] + ' ' if several else ''}{row['implementation']} on {row['device']}"


def _grouped(rows: list[dict], several: bool, counts) -> list[str]:
    by_place: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        by_place[_where(row, several)].append(f"{row['clause']} ({counts(row)})")
    lines = [f"{place}: {', '.join(items)}" for place, items in by_place.items()]
    if len(lines) > LINES_PER_KIND:
        lines = lines[:LINES_PER_KIND] + [f"... {len(lines) - LINES_PER_KIND} more (the report's baseline section)"]
    return lines


def terminal_lines(result: dict | None) -> list[str]:
    """The summary's baseline block: one line saying how this run compares, then the cells that changed."""
    if not result:
        return []
    suite = result["suite"]
    made_by = f"suite {suite.get('version')}" + (f" {str(suite['commit'])[:10]}" if suite.get("commit") else "")
    head = f"baseline {result['source']} ({made_by})"
    if result["no_change"]:
        lines = [f"{head}: no change"]
    else:
        counts = {k: len(result[k]) for k in ("newly_broken", "fixed", "deviations_added", "deviations_gone")}
        lines = [f"{head}: {counts['newly_broken']} newly broken, {counts['fixed']} fixed, "
                 f"{counts['deviations_added']} deviation(s) added, {counts['deviations_gone']} gone "
                 "(implementation x device x clause)"]
    several = len(result["environments"]) > 1
    kinds = (("NEWLY BROKEN ", "newly_broken", lambda r: f"{r['failed']} failed"),
             ("fixed        ", "fixed", lambda r: f"{r['baseline']['failed']} failed before"),
             ("deviation +  ", "deviations_added", lambda r: f"{r['deviation']}"),
             ("deviation -  ", "deviations_gone", lambda r: f"{r['baseline']['deviation']} before"))
    for label, kind, counts in kinds:
        lines += [f"  {label}{line}" for line in _grouped(result[kind], several, counts)]
    if result["judged_only_now"] or result["judged_only_before"]:
        lines.append(f"  cells judged only in this run: {result['judged_only_now']}; only in the baseline: "
                     f"{result['judged_only_before']}")
    changes = [f"{e['environment'] + ': ' if several else ''}{c}" for e in result["environments"] for c in e["changes"]]
    if result["same_spec"] is False:
        changes.append("spec hash differs: clauses, tolerances or fixtures changed since the baseline")
    if changes:
        lines.append(f"  changed since the baseline: {'; '.join(changes)}")
    for env in result["environments"]:
        if env["baseline_environment"] is None:
            lines.append(f"  {env['environment']}: not in the baseline (compared with nothing)")
    for env in result["baseline_environments_unpaired"]:
        lines.append(f"  the baseline's {env['environment']} ({env['description']}) has no counterpart here")
    return lines

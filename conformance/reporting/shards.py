"""``--shard I/N``: one run split across N runners, each running its share of the items and writing its own report;
``attention-conformance merge`` puts the N reports back together (conformance/reporting/merge.py).

The split is a function of the selected items alone (after -k, -m and the suite's own deselections), so every
shard, and every xdist worker inside a shard, computes the same plan without talking to the others:

* items are split in groups: the items of one fixture case (every implementation, device and dtype of
  ``test_fixture[ID-...]``) stay together, because the cross-backend agreement compares their outputs within one
  run; every other item is a group of its own;
* each group weighs its measured duration: the sum of its items' seconds in a durations file
  (``--shard-durations PATH``; default the suite's ``conformance/durations.json``, measured on a default run of the
  built-ins; ``attention-conformance merge --durations-out PATH`` writes one from the reports of a run). An item
  the file lacks weighs the median of its test function's measured items (a user's implementation runs the same
  test functions as the built-ins), else the median of all; an item skipped at collection weighs almost nothing;
* groups go, heaviest first (ties by name), to the shard with the least weight so far (ties to the lowest index):
  the longest-processing-time rule. Sorting by weight and name makes the plan independent of collection order.

Every shard records its part of the plan (``shard`` in the report): the digests of the whole selection and of the
plan, so that ``merge`` can tell the shards of one run apart from another's and refuse shards split by different
durations files (some items would have run twice, others never).

The coverage rule (conformance/reporting/coverage.py) needs the whole run: a shard applies the part that depends on the
collection alone (an implementation you named that can run nothing) and writes the rest into its report for the
merge to apply to all N shards together.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from attention_conformance.conformance.reporting.provenance import digest

SHARD_KEY = pytest.StashKey["Shard"]()


DURATIONS_FILE = Path(__file__).resolve().parent.parent / "durations.json"  # the suite's measured default run


DURATIONS_VERSION = 1


SKIPPED_WEIGHT = 0.002  # seconds: an item skipped at collection costs only its report


DEFAULT_WEIGHT = 1.0  # seconds: every item, when no durations are known at all


_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


INFO: dict = {}  # this shard's part of the plan, for the report (sent by xdist workers to the controller)


DURATIONS: dict[str, float] = {}  # nodeid -> seconds measured in this run (setup + call + teardown)


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse(text: str | None) -> Shard | None:
    """``--shard I/N`` (1 <= I <= N); None when not given. A malformed value is a usage error naming the option."""
    if text is None:
        return None
    match = _SPEC.fullmatch(str(text))
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise pytest.UsageError(f"--shard {text}: expected I/N with 1 <= I <= N, e.g. --shard 2/4")
    return Shard(int(match[1]), int(match[2]))


# ------------------------------------------------------------------ durations
def read_durations(path: Path | str | None, option: str = "--shard-durations") -> tuple[dict[str, float], str]:
    """(nodeid -> seconds, where they came from) from a durations file; a missing file gives none (the fallback
    weights apply), a malformed one is a usage error naming the file (and the ``option`` that named it)."""
    path = Path(path) if path else DURATIONS_FILE
    if not path.is_file():
        return {}, f"no durations file at {path}: every item weighs the same"
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError) as exc:
        raise pytest.UsageError(f"{option} {path}: not a durations file: {exc}") from None
    durations = data.get("durations", {}) if isinstance(data, dict) else None
    if not isinstance(durations, dict) or not all(isinstance(v, (int, float)) for v in durations.values()):
        raise pytest.UsageError(f"{option} {path}: expected {{\"durations\": {{nodeid: seconds}}}}")
    return {str(k): float(v) for k, v in durations.items()}, f"{path} ({len(durations)} items measured)"


def durations_file(durations: dict[str, float]) -> str:
    """A durations file's text: one item a line, sorted (easy to diff), milliseconds."""
    lines = [f"  {json.dumps(nodeid)}: {round(seconds, 3)}" for nodeid, seconds in sorted(durations.items())]
    return f'{{"version": {DURATIONS_VERSION}, "durations": {{\n' + ",\n".join(lines) + "\n}}\n"


def function_of(nodeid: str) -> str:
    """``conformance/test_x.py::test_y[params]`` -> ``conformance/test_x.py::test_y``."""
    return nodeid.split("[", 1)[0]


class Weights:
    """Each item's expected seconds: measured, else its test function's median, else the median of all."""

    def __init__(self, durations: dict[str, float]):
        self.durations = durations
        by_function: dict[str, list[float]] = {}
        for nodeid, seconds in durations.items():
            by_function.setdefault(function_of(nodeid), []).append(seconds)
        self.by_function = {name: statistics.median(values) for name, values in by_function.items()}
        self.default = statistics.median(durations.values()) if durations else DEFAULT_WEIGHT

    def of(self, nodeid: str, skipped: bool = False) -> float:
        if skipped:
            return SKIPPED_WEIGHT
        if nodeid in self.durations:
            return self.durations[nodeid]
        return self.by_function.get(function_of(nodeid), self.default)


# ------------------------------------------------------------------ the plan
def group_key(item) -> str:
    """The items that must share a shard: a fixture case's items (the agreement compares their outputs), else the
    item alone."""
    callspec = getattr(item, "callspec", None)
    fixture = callspec.params.get("fixture_case") if callspec else None
    fixture_id = getattr(fixture, "id", None)
    return f"{function_of(item.nodeid)}[{fixture_id}]" if fixture_id else item.nodeid


def plan(groups: dict[str, float], count: int) -> dict[str, int]:
    """Group -> shard (1-based): heaviest first, each to the lightest shard so far (longest processing time)."""
    totals = [0.0] * count
    assignment = {}
    for key in sorted(groups, key=lambda k: (-groups[k], k)):
        target = min(range(count), key=lambda i: (totals[i], i))
        totals[target] += groups[key]
        assignment[key] = target + 1
    return assignment


def split(items, count: int, weights: Weights) -> tuple[dict[str, int], list[float]]:
    """The plan for ``items`` (group -> shard) and the expected seconds of each shard."""
    groups: dict[str, float] = {}
    for item in items:
        skipped = item.get_closest_marker("skip") is not None
        key = group_key(item)
        groups[key] = groups.get(key, 0.0) + weights.of(item.nodeid, skipped)
    assignment = plan(groups, count)
    expected = [0.0] * count
    for key, target in assignment.items():
        expected[target - 1] += groups[key]
    return assignment, expected


def select(config, items) -> None:
    """Keep this shard's items (the others are deselected) and note its part of the plan. Called after every other
    deselection, in each process that collects (the only one, or every xdist worker of the shard)."""
    shard = config.stash.get(SHARD_KEY, None)
    if shard is None:
        return
    from attention_conformance.conformance.reporting import coverage

    coverage.note_whole_run(items)
    durations, source = read_durations(config.getoption("shard_durations", None))
    assignment, expected = split(items, shard.count, Weights(durations))
    keep = [item for item in items if assignment[group_key(item)] == shard.index]
    drop = [item for item in items if assignment[group_key(item)] != shard.index]
    INFO.clear()
    INFO.update({
        "index": shard.index, "count": shard.count, "items": len(keep), "of": len(items),
        "expected_seconds": [round(s, 1) for s in expected], "balanced_by": source,
        "selection": digest(sorted(item.nodeid for item in items)), "plan": digest(sorted(assignment.items())),
    })
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def send(config) -> None:
    """An xdist worker hands its part of the plan to the controller (every worker of a shard computes the same)."""
    if INFO:
        config.workeroutput["conformance_shard"] = dict(INFO)


def receive(node) -> None:
    info = getattr(node, "workeroutput", {}).get("conformance_shard")
    if info and not INFO:
        INFO.update(info)


def report_field(config) -> dict | None:
    """The report's ``shard``: this shard's part of the plan, or None for a run that is not split."""
    shard = config.stash.get(SHARD_KEY, None)
    if shard is None:
        return None
    return dict(INFO) or {"index": shard.index, "count": shard.count, "items": 0, "of": 0, "expected_seconds": [],
                          "balanced_by": "", "selection": "", "plan": ""}


def note_duration(report) -> None:
    """pytest_runtest_logreport on the controller (or the only process): each item's setup, call and teardown."""
    DURATIONS[report.nodeid] = DURATIONS.get(report.nodeid, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)


def no_items_is_success(session, config) -> None:
    """A shard that drew no item (more shards than groups) exits 0, not pytest's 5: its share of the run is empty."""
    if config.stash.get(SHARD_KEY, None) is not None and session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED \
            and INFO.get("of"):
        session.exitstatus = pytest.ExitCode.OK


def terminal_line(config) -> str | None:
    """The summary's line for a shard: its share, and that the coverage floor waits for the merge."""
    shard = config.stash.get(SHARD_KEY, None) if hasattr(config, "stash") else None
    if shard is None or not INFO:
        return None
    return (f"shard {shard}: {INFO['items']} of {INFO['of']} items (balanced by {INFO['balanced_by']}); the coverage "
            f"rule's floor is applied to all {shard.count} shards by `attention-conformance merge`")

"""A run that judged nothing is not green: the coverage rule, checked once at the end of the run.

The rule (docs/coverage-and-depth.md):
  1. Every implementation and operation that had runnable test items in this run (an
     operation it exposes, on a device present, in a dtype it declares) must have at
     least ``--min-judged`` (default 1) cases *judged*: passed, failed or a declared
     deviation. Unsupported cases do not count.
  2. An implementation named by the user (--impl, $ATTENTION_CONFORMANCE_IMPL, an entry
     point) that had no runnable item at all (its devices absent, no declared dtype among
     --dtype, a framework missing) fails the run, saying why.
  3. A run with conformance tests in it that judged no case at all fails.
Each violation is one line in the terminal summary, and the exit status becomes 1.
``--allow-unjudged`` reports the lines without failing (for a deliberately partial run). A run stopped
before its end (SIGTERM, Ctrl-C, -x) is not held to the rule: its report says it is incomplete.

Under xdist the workers collect and run; each sends which (implementation, operation)
pairs it had runnable items for, and the controller decides.

A shard of a split run (``--shard I/N``, conformance/reporting/shards.py) runs a part of the items, so its own counts
say
nothing about rules 1 and 3: a shard may hold none, or only unsupported, cases of an implementation that the
other shards judge plenty of. It applies rule 2, which depends only on the whole selection (every shard collects
all of it before keeping its share, so every shard reaches the same verdict), and writes what rules 1 and 3 need
into its report (``coverage_rule``: the whole run's runnable pairs, its collected count, the floor);
``attention-conformance merge`` applies them to the cases of all N shards together (conformance/reporting/merge.py).
"""
from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from attention_conformance.conformance.harness import session as run_state
from attention_conformance.conformance.judging.records import JUDGED, RECORDS, distinct

RUNNABLE: set[tuple[str, str]] = set()  # (implementation, operation) with a runnable item in this run


COLLECTED = [0]  # conformance items collected, runnable or not (deselected for an absent device included)


ABSENT: Counter = Counter()  # (device, implementation) -> items deselected because the device is absent here


# A shard's whole run, before it kept its share: runnable pairs and conformance items collected (absent included).
WHOLE_RUN: dict = {"runnable": set(), "collected": 0, "sharded": False}


PROBLEMS_KEY = pytest.StashKey[list]()


def _runnable(items) -> tuple[int, set[tuple[str, str]]]:
    """How many conformance items there are, and the (implementation, operation) pairs with a runnable one."""
    collected, pairs = 0, set()
    for item in items:
        if item.get_closest_marker("conformance") is None or item.get_closest_marker("selfcheck"):
            continue
        collected += 1  # an empty parameter set (nothing runnable here) counts too
        callspec = getattr(item, "callspec", None)
        impl = callspec.params.get("impl") if callspec else None
        if impl is None or not hasattr(impl, "name"):
            continue
        if item.get_closest_marker("skip") or callspec.params.get("dtype") is None:
            continue
        fixture = callspec.params.get("fixture_case")
        marker = item.get_closest_marker("op")
        op = fixture.op if fixture is not None else (marker.args[0] if marker else None)
        if op is not None:
            pairs.add((impl.name, op))
    return collected, pairs


def note_collection(items) -> None:
    """After deselection: remember which implementations and operations have runnable items."""
    collected, pairs = _runnable(items)
    COLLECTED[0] += collected
    RUNNABLE.update(pairs)


def note_whole_run(items) -> None:
    """A shard, before it keeps its share of ``items``: what the whole run collects (rules 2, and 1 and 3 at merge)."""
    collected, pairs = _runnable(items)
    WHOLE_RUN.update(runnable=pairs, collected=collected + sum(ABSENT.values()), sharded=True)


def note_absent(items) -> None:
    """Items deselected for an absent device: collected, never runnable here."""
    for item in items:
        mark = item.get_closest_marker("absent_device")
        ABSENT[(mark.kwargs["device"], mark.kwargs["impl"])] += 1
    COLLECTED[0] += len(items)


def send(config) -> None:
    config.workeroutput["conformance_runnable"] = sorted(RUNNABLE)
    config.workeroutput["conformance_collected"] = COLLECTED[0]
    config.workeroutput["conformance_absent"] = [[device, impl, n] for (device, impl), n in ABSENT.items()]
    if WHOLE_RUN["sharded"]:
        config.workeroutput["conformance_whole_run"] = [sorted(WHOLE_RUN["runnable"]), WHOLE_RUN["collected"]]


def receive(node) -> None:
    """Every worker collects every item: counts are the largest any worker saw, not their sum."""
    output = getattr(node, "workeroutput", {})
    RUNNABLE.update(tuple(pair) for pair in output.get("conformance_runnable", []))
    COLLECTED[0] = max(COLLECTED[0], output.get("conformance_collected", 0))
    for device, impl, n in output.get("conformance_absent", []):
        ABSENT[(device, impl)] = max(ABSENT[(device, impl)], n)
    if "conformance_whole_run" in output:
        runnable, collected = output["conformance_whole_run"]
        WHOLE_RUN.update(runnable=WHOLE_RUN["runnable"] | {tuple(pair) for pair in runnable},
                         collected=max(WHOLE_RUN["collected"], collected), sharded=True)


def absent_lines() -> list[str]:
    """One line per absent device: how many items were deselected and for whom."""
    by_device: dict[str, list] = defaultdict(list)
    for (device, impl), n in ABSENT.items():
        by_device[device].append((impl, n))
    return [f"pytest items deselected ({sum(n for _, n in who)}): {device} is not available on this machine "
            f"({', '.join(sorted(impl for impl, _ in who))})" for device, who in sorted(by_device.items())]


def judged_and_unsupported(records):
    """Judged cases per (implementation, operation), and the unsupported ones' reasons, of distinct ``records``."""
    judged: Counter = Counter()
    unsupported: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for rec in distinct(records):  # a replayed example is one case (as the summary counts)
        key = (rec.implementation, rec.op)
        if rec.status in JUDGED:
            judged[key] += 1
        elif rec.status == "unsupported":
            unsupported[key][(rec.message or "").split("\n")[0][:160]] += 1
    return judged, unsupported


def floor_problems(names, runnable, records, floor: int, collected: int) -> list[str]:
    """Rules 1 and 3 over ``records``: each runnable (implementation, operation) pair of ``names`` judged at least
    ``floor`` cases, and a run that collected conformance items judged some. Also applied by
    ``attention-conformance merge`` to the records of all shards of a split run."""
    judged, unsupported = judged_and_unsupported(records)
    lines = []
    for name in names:
        for op in sorted(op for impl_name, op in runnable if impl_name == name):
            count = judged[(name, op)]
            if count >= floor:
                continue
            reasons = unsupported[(name, op)]
            why = ""
            if reasons:
                reason, n = reasons.most_common(1)[0]
                why = f"; {sum(reasons.values())} unsupported, most often ({n}x): {reason}"
            lines.append(f"{name}: {count} {op} case(s) judged, fewer than --min-judged {floor}{why}")
    if collected and not sum(judged.values()) and not lines:
        lines.append(NOTHING_JUDGED)
    return lines


NOTHING_JUDGED = "no case was judged in this run (every conformance test was deselected, skipped or unsupported)"


def problems(config, impls, user_named: set[str], why_not_runnable) -> list[str]:
    """The coverage rule's violations, one line each (empty: the run judged enough). A shard applies rule 2 on the
    whole run's collection and leaves rules 1 and 3 to the merge (the module's docstring)."""
    runnable = WHOLE_RUN["runnable"] if WHOLE_RUN["sharded"] else RUNNABLE
    lines = []
    for impl in impls:
        if impl.name in user_named and not any(name == impl.name for name, _ in runnable):
            lines.append(f"{impl.name}: no case could run in this run: {why_not_runnable(impl)}")
    if WHOLE_RUN["sharded"]:
        return lines
    floor = floor_problems([impl.name for impl in impls], RUNNABLE, RECORDS, config.getoption("min_judged"),
                           COLLECTED[0])
    return lines + [line for line in floor if not (lines and line == NOTHING_JUDGED)]


def deferred_rule(config) -> dict | None:
    """A shard's report ``coverage_rule``: what the merge needs to apply rules 1 and 3 to the whole run."""
    if not WHOLE_RUN["sharded"]:
        return None
    return {"applied": "at merge", "min_judged": config.getoption("min_judged"),
            "allow_unjudged": bool(config.getoption("allow_unjudged")),
            "runnable": [list(pair) for pair in sorted(WHOLE_RUN["runnable"])], "collected": WHOLE_RUN["collected"]}


def enforce(session, impls, user_named: set[str], why_not_runnable) -> None:
    """Apply the rule on the controller (or the only process): record the lines, fail the run unless allowed."""
    config = session.config
    if config.option.collectonly or COLLECTED[0] == 0:
        return
    if run_state.stop_reason():  # a run stopped early judged what it reached: the rule is for whole runs
        return
    lines = problems(config, impls, user_named, why_not_runnable)
    config.stash[PROBLEMS_KEY] = lines
    # 1, not pytest's 5 ("no tests collected") when every item was deselected: CI wrappers often let 5 pass.
    if lines and not config.getoption("allow_unjudged") and session.exitstatus in (
            pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def terminal_lines(config) -> list[str]:
    lines = config.stash.get(PROBLEMS_KEY, [])
    verdict = "reported only (--allow-unjudged)" if config.getoption("allow_unjudged") else "the run fails"
    rule = [f"(coverage rule, docs/coverage-and-depth.md: {verdict})"] if lines else []
    return [f"COVERAGE: {line}" for line in lines] + rule

"""A run that judged nothing is not green: the coverage rule, checked once at the end of the run.

The rule (README, "Coverage"):
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
"""
from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from . import checks
from . import session as run_state
from .report import JUDGED, distinct

RUNNABLE: set[tuple[str, str]] = set()  # (implementation, operation) with a runnable item in this run
COLLECTED = [0]  # conformance items collected, runnable or not (deselected for an absent device included)
ABSENT: Counter = Counter()  # (device, implementation) -> items deselected because the device is absent here
PROBLEMS_KEY = pytest.StashKey[list]()


def note_collection(items) -> None:
    """After deselection: remember which implementations and operations have runnable items."""
    for item in items:
        if item.get_closest_marker("conformance") is None or item.get_closest_marker("selfcheck"):
            continue
        COLLECTED[0] += 1  # an empty parameter set (nothing runnable here) counts too
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
            RUNNABLE.add((impl.name, op))


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


def receive(node) -> None:
    """Every worker collects every item: counts are the largest any worker saw, not their sum."""
    output = getattr(node, "workeroutput", {})
    RUNNABLE.update(tuple(pair) for pair in output.get("conformance_runnable", []))
    COLLECTED[0] = max(COLLECTED[0], output.get("conformance_collected", 0))
    for device, impl, n in output.get("conformance_absent", []):
        ABSENT[(device, impl)] = max(ABSENT[(device, impl)], n)


def absent_lines() -> list[str]:
    """One line per absent device: how many items were deselected and for whom."""
    by_device: dict[str, list] = defaultdict(list)
    for (device, impl), n in ABSENT.items():
        by_device[device].append((impl, n))
    return [f"pytest items deselected ({sum(n for _, n in who)}): {device} is not available on this machine "
            f"({', '.join(sorted(impl for impl, _ in who))})" for device, who in sorted(by_device.items())]


def _judged_and_unsupported():
    judged: Counter = Counter()
    unsupported: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for rec in distinct(checks.RECORDS):  # a replayed example is one case (as the summary counts)
        key = (rec.implementation, rec.op)
        if rec.status in JUDGED:
            judged[key] += 1
        elif rec.status == "unsupported":
            unsupported[key][(rec.message or "").split("\n")[0][:160]] += 1
    return judged, unsupported


def problems(config, impls, user_named: set[str], why_not_runnable) -> list[str]:
    """The coverage rule's violations, one line each (empty: the run judged enough)."""
    floor = config.getoption("min_judged")
    judged, unsupported = _judged_and_unsupported()
    lines = []
    for impl in impls:
        pairs = sorted(op for name, op in RUNNABLE if name == impl.name)
        if not pairs and impl.name in user_named:
            lines.append(f"{impl.name}: no case could run in this run: {why_not_runnable(impl)}")
        for op in pairs:
            count = judged[(impl.name, op)]
            if count >= floor:
                continue
            reasons = unsupported[(impl.name, op)]
            why = ""
            if reasons:
                reason, n = reasons.most_common(1)[0]
                why = f"; {sum(reasons.values())} unsupported, most often ({n}x): {reason}"
            lines.append(f"{impl.name}: {count} {op} case(s) judged, fewer than --min-judged {floor}{why}")
    if COLLECTED[0] and not sum(judged.values()) and not lines:
        lines.append("no case was judged in this run (every conformance test was deselected, skipped or unsupported)")
    return lines


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
    return [f"COVERAGE: {line}" for line in lines] + ([f"(coverage rule, README 'Coverage': {verdict})"] if lines else [])

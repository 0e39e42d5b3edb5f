"""What one pytest session of the suite shares between its modules: the implementations it loaded, those the user
named, and whether the run went to its end (and if not, why it stopped).

conformance/plugin.py fills it (configure); the summary, the coverage rule and the reports read it. It imports no
other module of the suite, so nothing that reads it imports back the module that fills it.

A run stopped from outside still reports what it judged (docs/report.md, "complete"): SIGTERM (a CI timeout, `timeout
900 pytest ...`, `kill`) becomes a KeyboardInterrupt, so pytest takes its interrupted path as for Ctrl-C: the session
finishes, the conformance summary is printed and the report written, marked incomplete, and the exit status is 2.
"""
from __future__ import annotations

import signal
import threading
import time

import pytest

IMPLS_KEY = pytest.StashKey[list]()


USER_NAMED_KEY = pytest.StashKey[set]()  # named by the user (--impl, $ATTENTION_CONFORMANCE_IMPL, entry points)


TOUR_LEFT_OUT_KEY = pytest.StashKey[tuple]()  # the built-ins a bare dev-profile run leaves out (plugin.builtin_tour)


def implementations(config) -> list:
    """The implementations this run loaded (plugin.configure), in order."""
    return config.stash[IMPLS_KEY]


def user_named(config) -> set[str]:
    return config.stash.get(USER_NAMED_KEY, set())


# ------------------------------------------------------------------ how the run ended
# "reason": why the run stopped before its end (None: it has not); "signal_at": time.monotonic() of the SIGTERM;
# "finishing": the session is writing what it has (a further SIGTERM is then ignored); "previous": the handler
# replaced, restored at the end.
# "detail": what the report adds to the reason (how much came from the workers' streams).
STATE: dict = {"reason": None, "detail": "", "signal_at": None, "finishing": False, "previous": None, "started": None}


def started() -> None:
    STATE.update(reason=None, detail="", signal_at=None, finishing=False, started=time.monotonic())


def stop_reason(detailed: bool = False) -> str | None:
    """Why the run stopped before its end, or None; ``detailed``: with the report's detail."""
    reason = STATE["reason"]
    return f"{reason} ({STATE['detail']})" if reason and detailed and STATE["detail"] else reason


def note_stopped(reason: str) -> None:
    """Remember why the run stopped early (the first reason wins: a SIGTERM, then pytest's KeyboardInterrupt)."""
    if not STATE["reason"]:
        STATE["reason"] = reason


REPEAT_AFTER_S = 5.0  # a further SIGTERM this long after the first interrupts again (sooner: the same stop)


def _on_sigterm(signum, frame):
    if STATE["finishing"]:
        return  # the session is already writing its summary and report: let it
    now, first = time.monotonic(), STATE["signal_at"]
    if first is None and STATE["reason"]:
        return  # already stopping (Ctrl-C reached this worker and its controller, which then signals it)
    if first is None:
        STATE["signal_at"] = now
        note_stopped("interrupted by SIGTERM")
        raise KeyboardInterrupt("SIGTERM")
    # A worker gets SIGTERM twice when `timeout` signals the process group and the controller then signals it:
    # the second is the same stop. Much later, something swallowed the first: interrupt again.
    if now - first >= REPEAT_AFTER_S:
        raise KeyboardInterrupt("SIGTERM (again)")


def install_signal_handlers() -> None:
    """SIGTERM -> KeyboardInterrupt, in this process (controller, worker or the only one). Main thread only."""
    started()
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is _on_sigterm:
        return
    STATE["previous"] = previous
    signal.signal(signal.SIGTERM, _on_sigterm)


def finishing() -> None:
    """The session finishes (sessionfinish): a further SIGTERM no longer interrupts the summary and report."""
    STATE["finishing"] = True


def restore_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        previous = STATE["previous"]
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    STATE["previous"] = None


def keyboard_interrupt(excinfo) -> None:
    """pytest_keyboard_interrupt: a Ctrl-C, our SIGTERM, pytest.exit(), -x/--maxfail, or (under xdist) a worker's."""
    value = excinfo.value
    if isinstance(value, pytest.exit.Exception):
        note_stopped(f"stopped by pytest.exit: {value.msg}")
    elif type(value).__name__ == "Interrupted" and str(value):  # session.shouldstop: -x, --maxfail, a worker's
        note_stopped(f"stopped early: {value}")
    else:
        note_stopped("interrupted by SIGINT (Ctrl-C)" if not str(value) else f"interrupted: {value}")


def seconds_since_signal() -> float | None:
    at = STATE["signal_at"]
    return None if at is None else time.monotonic() - at

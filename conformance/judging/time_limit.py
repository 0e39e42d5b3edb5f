"""The per-test time limit (pytest-timeout's `--timeout`; the suite's default 120 s) made to hold.

pytest-timeout's default method, "signal", arms SIGALRM once and on expiry raises ``pytest.fail``'s ``Failed``
in the test. Inside a Hypothesis property that is the wrong exception: Hypothesis counts ``Failed`` as a failing
example (hypothesis.core.failure_exceptions_to_catch), so it shrinks and replays it, with no timer left. A
property that timed out at 120 s went on shrinking and replaying (each new shape of a JAX implementation
another XLA compile): single failing JAX tests took 170-193 s, and a slow implementation that timed out on one
example came back as a FlakyFailure (measured: `--timeout 8` on tests/slow_attention.py at 0.5 s a call, a
`thorough` property: 12.7 s, Hypothesis's "Failed to reproduce exception").

Here, for the suite's runs (attention_conformance/pytest_plugin.py, pytest_timeout_set_timer), the limit raises
``TimeLimitExceeded``, a BaseException: Hypothesis lets it through at once (as it does checks.HungEarlier), pytest
reports the test failed with it. The timer then repeats every REPEAT_S seconds while the test function is still
running, so a handler that swallowed it (an ``except BaseException`` somewhere) cannot make the limit a suggestion.
Other methods (`--timeout-method thread`) and runs outside the main thread are left to pytest-timeout.
"""
from __future__ import annotations

import signal
import threading
import time

from attention_conformance.conformance.judging.records import RECORDS

REPEAT_S = 2.0  # after the limit, raise again this often while the test function still runs


_RUNNING: dict = {"item": None}  # the item whose test function (pytest_runtest_call) is running


# The implementation call the test is waiting for (containment._call_in_thread): (implementation, case, start time).
_WAITING: dict = {"call": None}


class TimeLimitExceeded(BaseException):
    """The test ran past the per-test time limit. Not an Exception (nor pytest's Failed): Hypothesis would take
    either for a failing example and shrink it with no limit left."""


def message(seconds: float, nodeid: str = "") -> str:
    text = (f"Timeout: the test ran past the per-test time limit of {seconds:g} s (pytest-timeout's --timeout, or a "
            "timeout marker; the stacks of any other threads are printed above). A property test stops here, "
            "without shrinking further")
    waiting = _WAITING["call"]
    if waiting is not None:  # what the limit interrupted: on a GPU, a compile (torch_flex: 85 s in Triton)
        name, label, started = waiting
        text += f". It was waiting {time.monotonic() - started:.1f} s for a call of {name} on case {label}"
    failed = _failed_before(nodeid) if nodeid else []
    if failed:
        text += (f". Before the limit, {len(failed)} case(s) of this test failed (in the report); the last:\n"
                 + failed[-1].message)
    return text


def _failed_before(nodeid: str) -> list:
    """The failed case records this test left so far (checks.RECORDS, newest last)."""

    found = []
    for rec in reversed(RECORDS):
        if rec.test != nodeid:
            break
        if rec.status == "failed":
            found.append(rec)
    return found[::-1]


def call_started(item) -> None:
    _RUNNING["item"] = item


def call_ended(item) -> None:
    if _RUNNING["item"] is item:
        _RUNNING["item"] = None


def waiting_for(call: tuple | None) -> None:
    """The implementation call the running test now waits for, (name, case label, time.monotonic() at its start), or
    None: named in the message of a limit that interrupts the wait."""
    _WAITING["call"] = call


def running_test() -> str | None:
    """The node id of the test whose function is running, or None outside one."""
    item = _RUNNING["item"]
    return None if item is None else item.nodeid


def set_timer(item, settings) -> bool | None:
    """pytest_timeout_set_timer for the "signal" method on the main thread; None leaves it to pytest-timeout."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "SIGALRM"):
        return None
    import pytest_timeout

    fired = {"times": 0}

    def handler(signum, frame):
        __tracebackhide__ = True
        if not settings.disable_debugger_detection and pytest_timeout.is_debugging():
            return
        fired["times"] += 1
        if fired["times"] > 1 and _RUNNING["item"] is not item:
            return  # the first one ended the test function: pytest is reporting, leave it be
        if fired["times"] == 1:
            terminal = item.config.get_terminal_writer()
            if len(threading.enumerate()) > 1:
                terminal.sep("+", title="Timeout")
                pytest_timeout.dump_stacks(terminal)
                terminal.sep("+", title="Timeout")
        raise TimeLimitExceeded(message(settings.timeout, item.nodeid))

    def cancel():
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # pytest-timeout's pytest_timeout_cancel_timer calls it
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout, REPEAT_S)
    return True

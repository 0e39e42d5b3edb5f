"""The attention-conformance pytest plugin.

Options, the implementation registry wiring, parametrisation of every conformance
test over implementations x devices x dtypes, Hypothesis profiles, and the
end-of-run summary and report. Tests live in conformance/ (run against the
implementations; what a bare `pytest` runs) and tests/ (the suite checking
itself; `pytest tests`, and CI runs both).
"""
from __future__ import annotations

import os

import pytest

from attention_conformance.conformance import plugin as support

# Profiles are registered at import so that Hypothesis's own --hypothesis-profile can pick one.
support.register_hypothesis_profiles()


def pytest_addoption(parser):
    group = parser.getgroup("attention-conformance")
    group.addoption(
        "--impl", action="append", default=[], metavar="MODULE[:ATTR]",
        help="implementation to validate (repeatable). Without it, every built-in and every "
        "implementation found through $ATTENTION_CONFORMANCE_IMPL or entry points runs.",
    )
    group.addoption(
        "--device", choices=support.DEVICES + ("all",), default="all",
        help="devices to test: cpu, cuda, or all (default; cases for an absent device are skipped with the reason).",
    )
    group.addoption(
        "--dtype", action="append", default=[], choices=support.DTYPE_NAMES,
        help="restrict to these dtypes (repeatable; default: every dtype each implementation declares).",
    )
    group.addoption("--conformance-report", metavar="PATH", default=None,
                    help="write the JSON conformance report to PATH and an HTML page beside it.")
    group.addoption("--list-impls", action="store_true", default=False,
                    help="print the implementations found, what they declare and support, then exit.")
    group.addoption("--no-builtins", action="store_true", default=False,
                    help="do not add the built-in implementations when no --impl is given.")
    group.addoption("--jax-compilation-cache", metavar="DIR|off", default=".attention-conformance/jax-cache",
                    help="JAX's persistent compilation cache for this run, relative to the rootdir "
                    "(default: %(default)s; 'off' disables it; $JAX_COMPILATION_CACHE_DIR, if set, wins).")
    group.addoption("--call-timeout", metavar="SECONDS", default=None,
                    help="time limit of each call of an implementation (default 30; 0 or off: no limit). A call past "
                    "it fails its case as a hang, and the implementation's later calls fail at once "
                    "(sets $ATTENTION_CONFORMANCE_CALL_TIMEOUT).")
    group.addoption("--min-judged", type=int, default=1, metavar="N",
                    help="coverage floor: each implementation and operation with runnable cases must have at least N "
                    "cases judged (passed, failed or a declared deviation), else the run fails (default 1).")
    group.addoption("--allow-unjudged", action="store_true", default=False,
                    help="report a run that judged too few cases (README 'Coverage') without failing it.")
    group.addoption("--large-shapes", action="store_true", default=False,
                    help="also run conformance/test_large_shapes.py: sdpa at Lk up to 16384, D 128, judged by the "
                    "blocked float64 oracle (slow; see docs/large-shapes.md).")


def pytest_configure(config):
    if config.getoption("call_timeout") is not None:  # xdist workers inherit it
        os.environ["ATTENTION_CONFORMANCE_CALL_TIMEOUT"] = str(config.getoption("call_timeout"))
    config.addinivalue_line("markers", "conformance: a case run against an implementation")
    config.addinivalue_line("markers", "selfcheck: the suite checking itself (deselected with --impl)")
    support.configure(config)


def pytest_collection_modifyitems(config, items):
    support.deselect_selfcheck_for_user_impls(config, items)


def pytest_collection_finish(session):
    """After every deselection (-k, -m, ours): what is left to run is what the coverage rule expects judged."""
    from attention_conformance.conformance import coverage

    coverage.note_collection(session.items)


def pytest_generate_tests(metafunc):
    support.parametrize(metafunc)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    support.terminal_summary(terminalreporter, config)


def pytest_sessionfinish(session, exitstatus):
    support.enforce_coverage(session)
    support.write_report(session, session.exitstatus)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    """pytest-xdist: before the workers start, give each its share of the cores (they inherit the variables)."""
    support.share_cores_between_workers(len(specs))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist: a worker finished; merge its conformance records into the controller's."""
    support.receive_from_worker(node)
    from attention_conformance.conformance import coverage

    coverage.receive(node)

"""pytest's log capture in the suite's runs (attention_conformance/pytest_plugin.py, ``_leave_log_capture_out``).

A run of the conformance tests alone leaves pytest's log capture out (0.4 ms of CPU per test; docs/speed.md), yet a
warning the implementation logs still reaches the user with its failed test, as captured stderr; a run that names a
log option keeps pytest's capture, and shows it as captured log.
"""
from __future__ import annotations

import os
import textwrap

import pytest

from .test_cli import ROOT, pytest_run

pytestmark = pytest.mark.selfcheck

KERNEL = textwrap.dedent('''
    """A softmax that logs a warning on every call and scales its result by 1.5 (wrong)."""
    import logging

    import numpy as np

    log = logging.getLogger("logging_kernel")


    def softmax(x, axis=-1):
        log.warning("logging_kernel: the slow path")
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return (1.5 * e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)
''')


def run_kernel(tmp_path, *options: str):
    (tmp_path / "logging_kernel.py").write_text(KERNEL)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return pytest_run("conformance/test_properties.py", "-k", "test_softmax_matches_oracle", "--dtype", "float64",
                      "--impl", "logging_kernel", *options, env=env)


def test_a_logged_warning_reaches_the_user_without_pytests_log_capture(tmp_path):
    done = run_kernel(tmp_path)
    assert done.returncode == 1 and "[softmax." in done.stdout, done.stdout[-3000:]
    assert "Captured log" not in done.stdout
    assert "Captured stderr call" in done.stdout and "logging_kernel: the slow path" in done.stdout, done.stdout[-3000:]


def test_a_run_that_names_a_log_option_keeps_pytests_log_capture(tmp_path):
    done = run_kernel(tmp_path, "--log-level=WARNING")
    assert done.returncode == 1, done.stdout[-3000:]
    captured = done.stdout.split("Captured log call", 1)
    assert len(captured) == 2 and "logging_kernel: the slow path" in captured[1], done.stdout[-3000:]

"""Fixtures the self-checks share."""
from __future__ import annotations

import pytest

from attention_conformance.conformance.judging import records


@pytest.fixture(autouse=True)
def kept_records():
    """Judges in a self-check record cases; the session's conformance report must not see them. Autouse: a
    self-check that forgot it (test_fp8's FP8_OUTPUT_DTYPE check) put a stand-in's failed case into the session's
    summary and report of CI's `pytest conformance tests`, and into the records a later self-check on the same worker
    reads (test_verdicts, once items were ordered by implementation)."""
    kept = list(records.RECORDS)
    yield
    records.RECORDS[:] = kept

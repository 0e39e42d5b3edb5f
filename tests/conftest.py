"""Fixtures the self-checks share."""
from __future__ import annotations

import pytest

from attention_conformance.conformance import checks


@pytest.fixture
def kept_records():
    """Judges in a self-check record cases; the session's conformance report must not see them."""
    kept = list(checks.RECORDS)
    yield
    checks.RECORDS[:] = kept

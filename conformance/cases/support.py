"""Cases an implementation cannot run: unsupported, never failed.

A strategy that cannot draw inside the declared region, or a call the implementation refuses, marks the case
unsupported (the example rejected inside Hypothesis, the test skipped elsewhere); a property whose first
UNSUPPORTED_BEFORE_SKIP cases were all unsupported is skipped saying why.
"""
from __future__ import annotations

import pytest

# ------------------------------------------------------------ cases the implementation cannot run
# The latest reason a case was not judged (unsupported, or a declared deviation: judging.py), for the
# skip message of a property test whose every case was.
LAST_UNSUPPORTED = [""]


# Hypothesis gives up on a test only after about 460 rejected examples; an
# implementation that cannot run any case of a property (a module that only does
# self-attention, say) would pay for all of them. After this many unsupported
# examples with none supported, the property is skipped as unsupported. Strategies
# draw the common layouts (Dv == Dk, head width E / H) half the time, so a
# partially supporting implementation reaches it with probability below 1e-7.
UNSUPPORTED_BEFORE_SKIP = 20


# Of the running property test: cases called, refused, judged (passed or failed), and declared deviations.
SUPPORT_COUNTS = {"supported": 0, "unsupported": 0, "judged": 0, "deviation": 0}


def reset_support_counts() -> None:
    SUPPORT_COUNTS.update(supported=0, unsupported=0, judged=0, deviation=0)


def not_judged(reason: str, kind: str, count: str, judged: str, outside) -> None:
    """A case the property does not judge, of ``kind`` ("unsupported", "declared deviation"): inside Hypothesis the
    example is rejected (the test goes on with others; SUPPORT_COUNTS[count] counts it, and once the first
    UNSUPPORTED_BEFORE_SKIP cases were all such with none SUPPORT_COUNTS[judged], the test is skipped saying so);
    elsewhere ``outside`` (pytest.skip, pytest.xfail) ends the test. Never a failure."""
    from hypothesis import reject
    from hypothesis.control import currently_in_test_context

    if currently_in_test_context():
        SUPPORT_COUNTS[count] += 1
        if SUPPORT_COUNTS[judged] == 0 and SUPPORT_COUNTS[count] >= UNSUPPORTED_BEFORE_SKIP:
            pytest.skip(f"{kind}: the first {UNSUPPORTED_BEFORE_SKIP} generated cases all were ({reason})")
        reject()
    outside(f"{kind}: {reason}")


def unsupported(reason: str):
    """Report a case as unsupported: inside Hypothesis the example is rejected (the test goes on
    with others), elsewhere the test is skipped. Never a failure."""
    LAST_UNSUPPORTED[0] = reason
    not_judged(reason, "unsupported", "unsupported", "supported", pytest.skip)

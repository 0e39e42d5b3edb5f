"""Running one case on one implementation and judging it against the oracle: the Judge, and the names
the tests import from here.

The work is split by job, one module each:

- containment.py: calling the implementation so that whatever it does stays with one case: the call
  time limit and hangs, the copies of the inputs and the "contract.inputs-unchanged" check, and the
  result's contract ("contract.result-type", "sdpa.output-shape" / "mha.shapes", "sdpa.output-dtype",
  and "sdpa.finite": no non-finite output where the oracle is finite); cases it cannot run are
  unsupported, never failed.
- attribution.py: blaming the clause at fault, by re-running a failing case without a feature the test
  is not about (the causal flag, the mask, the default scale, grouped kv heads, a variant keyword).
- judging.py: the verdict: the output against the oracle under the tolerance model, fully masked rows
  under the declared policy, the wording of a failure, declared deviations, and the records of the run.
- expected.py: what a case should give (the oracle's output and the allowed error), which both the
  verdict and the attribution's probes ask for.

This module keeps the names other modules, the self-checks and users' scripts import from
``conformance.checks`` (the Judge above all); the objects are the same (``checks.RECORDS`` is
``judging.RECORDS``), so code that changes them in place reaches every module.
"""
from __future__ import annotations

from .attribution import VARIANT_CLAUSE_KEYWORDS, Attribution
from .containment import (
    CALL_TIMEOUT_VARIABLE,
    COMPILED_CALL_ALLOWANCE,
    DEFAULT_CALL_TIMEOUT_S,
    INPUTS_CLAUSE,
    LAST_UNSUPPORTED,
    RESULT_CLAUSE,
    SUPPORT_COUNTS,
    UNSUPPORTED_BEFORE_SKIP,
    Containment,
    HungEarlier,
    ImplementationHung,
    call_timeout_s,
    call_with_limit,
    reset_support_counts,
    unsupported,
)
from .expected import allowed_error, expected_output
from .judging import (
    DEFINITION_CLAUSES,
    MAX_REPRO_ELEMENTS,
    OWN_CHECK_CLAUSES,
    RECORDS,
    Judge,
    accuracy_clause,
    breaks_order,
    declared_deviation,
)

__all__ = [
    "CALL_TIMEOUT_VARIABLE", "COMPILED_CALL_ALLOWANCE", "DEFAULT_CALL_TIMEOUT_S", "DEFINITION_CLAUSES",
    "INPUTS_CLAUSE", "LAST_UNSUPPORTED", "MAX_REPRO_ELEMENTS", "OWN_CHECK_CLAUSES", "RECORDS", "RESULT_CLAUSE",
    "SUPPORT_COUNTS", "UNSUPPORTED_BEFORE_SKIP", "VARIANT_CLAUSE_KEYWORDS", "Attribution", "Containment",
    "HungEarlier", "ImplementationHung", "Judge", "accuracy_clause", "allowed_error", "breaks_order",
    "call_timeout_s", "call_with_limit", "declared_deviation", "expected_output", "reset_support_counts",
    "unsupported",
]

"""Run the whole conformance battery in-process on one implementation, collecting verdicts.

The self-check uses this to show that every broken zoo member is rejected by the
clause it breaks and every correct one passes, without a pytest subprocess per
member. Property tests run derandomized and without shrinking: the verdict, not
the minimal example, is what the self-check needs.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings

from attention_conformance.conformance import (
    test_dropout,
    test_fixtures,
    test_fp8,
    test_gradients,
    test_lse,
    test_merge_states,
    test_mha,
    test_mha_gradients,
    test_paged,
    test_pairwise,
    test_properties,
    test_sequence_gradients,
    test_variant_gradients,
    test_variants,
    test_varlen,
)
from attention_conformance.conformance.cases.fixtures import fixtures
from attention_conformance.conformance.harness import properties
from attention_conformance.conformance.judging import agreement, records
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.implementations.arrays import is_eight_bit

PROPERTY_TESTS = [
    fn
    for module in (test_properties, test_mha, test_gradients, test_dropout, test_variants, test_variant_gradients,
                   test_varlen, test_paged, test_fp8, test_lse, test_merge_states, test_pairwise,
                   test_sequence_gradients, test_mha_gradients)
    for name, fn in vars(module).items()
    if name.startswith("test_") and callable(fn) and hasattr(fn, "__wrapped__")
]


@dataclass
class Verdicts:
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (test, dtype, clause)
    errors: list[tuple[str, str, str]] = field(default_factory=list)  # harness errors: (test, dtype, repr)
    deviations: list[tuple[str, str, str]] = field(default_factory=list)  # declared, outside Hypothesis: xfail
    passed: int = 0
    records: list = field(default_factory=list)  # the case records the run made (checks.RECORDS), then dropped

    @property
    def clauses(self) -> set[str]:
        return {clause for _, _, clause in self.failures}


def _marks(fn) -> list:
    """The test's own marks, then its module's."""
    import sys

    module_marks = getattr(sys.modules[fn.__module__], "pytestmark", [])
    module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
    return [*getattr(fn, "pytestmark", []), *module_marks]


def _op(fn) -> str | None:
    """The contract operation a test exercises: its own op mark, else its module's."""
    return next((mark.args[0] for mark in _marks(fn) if mark.name == "op"), None)


def _runs_in(fn, dtype: str) -> bool:
    """What collection decides (conformance/plugin.py): a test marked eight_bit runs in the 8-bit dtypes only, every
    other test in the others only."""
    return any(mark.name == "eight_bit" for mark in _marks(fn)) == is_eight_bit(dtype)


def _run(verdicts: Verdicts, name: str, dtype: str, call) -> None:
    try:
        call()
    except ConformanceFailure as failure:
        verdicts.failures.append((name, dtype, failure.clause))
    except pytest.skip.Exception:
        pass
    except pytest.xfail.Exception as declared:  # a KNOWN_DEVIATIONS entry covered a failure
        verdicts.deviations.append((name, dtype, str(declared)))
    except Exception as exc:  # a bug of the suite, not a verdict
        verdicts.errors.append((name, dtype, repr(exc)))
    else:
        verdicts.passed += 1


def run_battery(impl, *, dtypes=("float64", "float32"), max_examples: int = 20, stop_on=frozenset(),
                brief: bool = False) -> Verdicts:
    """Fixtures and property tests on CPU; stops early once a failure names a clause in ``stop_on``.

    ``brief``: every property runs its brief covering set and no floor (conformance/properties.py):
    a correct kernel-shaped member in all its dtypes took 50-120 s with the full set.
    The run leaves no trace in the session's conformance records or agreement matrix.
    """
    kept_records, kept_outputs = list(records.RECORDS), {k: dict(v) for k, v in agreement._OUTPUTS.items()}
    try:
        with properties.brief_covering_everywhere() if brief else contextlib.nullcontext():
            verdicts = _run_battery(impl, dtypes, max_examples, stop_on)
        verdicts.records = records.RECORDS[len(kept_records):]
        return verdicts
    finally:
        records.RECORDS[:] = kept_records
        agreement._OUTPUTS.clear()
        agreement._OUTPUTS.update(kept_outputs)


# Clause families whose tests live in one module: a member expected to break one
# of them has that module's tests run first, so it is stopped early (the verdict
# is the same; only the order of the battery changes).
FAMILY_MODULES = {"grad.": test_gradients, "dropout.": test_dropout, "mha.": test_mha, "varlen.": test_varlen,
                  "paged.": test_paged, "sdpa.fp8-": test_fp8, "lse.": test_lse, "merge.": test_merge_states, "sdpa.feature-pairs": test_pairwise,
                  **{clause: test_variants for clause in ("sdpa.window", "sdpa.softcap", "sdpa.alibi",
                                                          "sdpa.query-offset", "sdpa.varlen", "sdpa.variant-order",
                                                          "sdpa.learnable-sink", "sdpa.sink-tokens",
                                                          "sdpa.attention-chunk", "sdpa.key-leftpad")},
                  **{clause: test_variant_gradients for clause in ("grad.softcap", "grad.variants",
                                                                   "grad.learnable-sink")},
                  "grad.varlen": test_sequence_gradients, "grad.mha": test_mha_gradients}


def _family_tests(stop_on) -> list:
    modules = {module.__name__ for prefix, module in FAMILY_MODULES.items() if any(c.startswith(prefix) for c in stop_on)}
    return [fn for fn in PROPERTY_TESTS if fn.__module__ in modules]


def _run_battery(impl, dtypes, max_examples, stop_on) -> Verdicts:
    verdicts = Verdicts()
    first = _family_tests(stop_on)
    for dtype in [d for d in dtypes if d in impl.dtypes]:
        for fn in (fn for fn in first if _runs_in(fn, dtype)):
            _run_property(verdicts, impl, fn, dtype, max_examples)
            if verdicts.clauses & stop_on:
                return verdicts
        for fx in fixtures():
            if fx.op == "scores" or not impl.implements(fx.op) or not fx.runs_in(dtype):
                continue
            _run(verdicts, f"test_fixture[{fx.id}]", dtype,
                 lambda: test_fixtures.test_fixture(fx, impl, "cpu", dtype))
            if verdicts.clauses & stop_on:
                return verdicts
        for fn in (fn for fn in PROPERTY_TESTS if fn not in first and _runs_in(fn, dtype)):
            _run_property(verdicts, impl, fn, dtype, max_examples)
            if verdicts.clauses & stop_on:
                return verdicts
    return verdicts


def _run_property(verdicts: Verdicts, impl, fn, dtype: str, max_examples: int) -> None:
    op = _op(fn)
    if op and not impl.implements(op):
        return
    # What pytest's collection decides from the test's applies_to marker (conformance/plugin.py)
    if any(mark.name == "applies_to" and mark.args[0](impl) for mark in getattr(fn, "pytestmark", [])):
        return
    inner = fn.__wrapped__  # the Hypothesis-wrapped test under @property_test
    base = inner._hypothesis_internal_use_settings
    inner._hypothesis_internal_use_settings = settings(
        base, max_examples=max_examples, derandomize=True, database=None,
        phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False, print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    try:
        for extra in _own_parameters(fn):
            _run(verdicts, fn.__name__, dtype, lambda: fn(impl=impl, device="cpu", dtype=dtype, **extra))
    finally:
        inner._hypothesis_internal_use_settings = base


PARAM_TYPE = type(pytest.param(None))  # what pytest.param returns: its .values is always a tuple


def _own_parameters(fn) -> list[dict]:
    """Every keyword combination of the test's own @pytest.mark.parametrize marks ([{}] if it has none)."""
    combinations = [{}]
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = [row.values if isinstance(row, PARAM_TYPE) else row if len(names) > 1 else (row,)
                for row in mark.args[1]]
        combinations = [{**done, **dict(zip(names, row))} for done in combinations for row in rows]
    return combinations

"""No check passes on non-finite output where the oracle is finite.

The stand-ins of tests/nan_standins.py are right except that they return NaN: everywhere, in one row,
or only when a call meets a condition (is_causal, Lq > Lk, a mask); the torch ones give NaN in dL/dq.
They run through the conformance tests as a user runs them (``pytest conformance --impl ...`` in a
subprocess, tests/test_cli.py's ``pytest_run``), each call that returned a NaN where the contract
specifies a value noting its test id. Every such test must end failed, never passed: a metamorphic
property compares an implementation with itself (NaN == NaN) or with a bound (NaN < low is False),
and used to record a pass on an all-NaN output (27 test items did, on these stand-ins, before the
contract check of every result refused non-finite output: conformance/containment.py, _check_finite).
"""
from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

import pytest

from tests import nan_standins

from .test_cli import ROOT, pytest_run

pytestmark = pytest.mark.selfcheck

NUMPY_STANDINS = ("NaNAlways", "NaNInOneRow", "NaNWhenCausal", "NaNWhenMoreQueriesThanKeys", "NaNWhenMasked")
TORCH_STANDINS = ("TorchNaNGradient", "TorchNaNGradientWhenCausal")
# Every property of test_properties.py on every stand-in; the fixtures and multi-head attention on the
# one-row stand-in only (their tests judge every output against the oracle, so they are cheap to break and
# the central check is the same; a run on all five stand-ins took 20 s more).
SELECTION = "test_properties.py or (nan_in_one_row and (test_fixture or test_mha))"
OUTCOME = re.compile(r"^(PASSED|FAILED|XFAIL|XPASS|ERROR) (\S+)")


def property_names() -> set[str]:
    """The test functions of conformance/test_properties.py (read from its source, not imported) that run in
    float64, the stand-ins' dtype: not those marked for other dtypes only (``pytest.mark.dtypes``)."""
    tree = ast.parse((ROOT / "conformance" / "test_properties.py").read_text())

    def float64_excluded(node) -> bool:
        return any(isinstance(d, ast.Call) and ast.unparse(d.func) == "pytest.mark.dtypes"
                   and "float64" not in [ast.literal_eval(a) for a in d.args] for d in node.decorator_list)

    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
            and not float64_excluded(node)}


def run_standins(log: Path, paths: list[str], standins, *options: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """Run ``paths`` on the stand-ins; returns (test id -> outcome, stand-in NAME -> test ids that got a NaN)."""
    log.unlink(missing_ok=True)
    impls = [arg for name in standins for arg in ("--impl", f"tests.nan_standins:{name}")]
    # -rA lists every test with its outcome; the tracebacks of some hundred failures are not needed. The calls are
    # small: one BLAS thread (a second one only contends with the other xdist worker of a self-check run).
    single_thread = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    done = pytest_run(*paths, *impls, "--hypothesis-seed", "0", "-rA", "--tb=no", *options,
                      env={nan_standins.LOG_VARIABLE: str(log), "PYTEST_CURRENT_TEST": "", **single_thread})
    outcomes = {m.group(2): m.group(1) for m in map(OUTCOME.match, done.stdout.splitlines()) if m}
    assert outcomes, f"no test outcome in the run's output:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    noted = collections.defaultdict(set)
    for line in (log.read_text().splitlines() if log.exists() else []):
        name, test = line.split("\t")
        noted[name].add(test)
    return outcomes, noted


def passed_on_nan(outcomes: dict[str, str], noted: dict[str, set[str]]) -> list[str]:
    return sorted(f"{outcomes.get(test, 'no outcome')} {test}" for tests in noted.values() for test in tests
                  if outcomes.get(test) != "FAILED")


def false_alarms(outcomes: dict[str, str], noted: dict[str, set[str]]) -> list[str]:
    """Tests that failed although no call of theirs returned a NaN: the stand-ins are right otherwise."""
    met = set().union(*noted.values())
    return sorted(test for test, outcome in outcomes.items() if outcome in ("FAILED", "ERROR") and test not in met)


def test_no_forward_check_passes_on_nan(tmp_path):
    outcomes, noted = run_standins(tmp_path / "nan_calls.log", ["conformance/test_properties.py",
                                                                "conformance/test_fixtures.py", "conformance/test_mha.py"],
                                   NUMPY_STANDINS, "-k", SELECTION)
    passed, alarms = passed_on_nan(outcomes, noted), false_alarms(outcomes, noted)
    assert not passed, "tests that did not fail although the implementation returned NaN:\n" + "\n".join(passed)
    assert not alarms, "tests that failed although no call of theirs returned NaN:\n" + "\n".join(alarms)
    # Every property met NaN: the ones NaN always gives and the one-row NaN, each in every property.
    for standin in ("nan_always", "nan_in_one_row"):
        met = {test.split("::")[1].split("[")[0] for test in noted[standin] if "test_properties.py" in test}
        assert property_names() <= met, f"{standin}: properties that never called it: {property_names() - met}"
    assert any("test_fixtures.py" in test for test in noted["nan_in_one_row"])
    assert any("test_mha.py" in test for test in noted["nan_in_one_row"])
    # Each condition was met somewhere, and each conditional stand-in passed where it was not.
    for standin in ("nan_when_causal", "nan_when_lq_above_lk", "nan_when_masked"):
        assert noted[standin], f"{standin} never met its condition"
        assert any(outcome == "PASSED" and f"[{standin}-" in test for test, outcome in outcomes.items()), standin


def test_no_gradient_check_passes_on_nan(tmp_path):
    pytest.importorskip("torch")
    outcomes, noted = run_standins(tmp_path / "nan_calls.log", ["conformance/test_gradients.py"], TORCH_STANDINS)
    passed, alarms = passed_on_nan(outcomes, noted), false_alarms(outcomes, noted)
    assert not passed, "tests that did not fail although the implementation returned NaN:\n" + "\n".join(passed)
    assert not alarms, "tests that failed although no call of theirs returned NaN:\n" + "\n".join(alarms)
    gradient_tests = {test.split("[")[0] for test in outcomes if "test_gradients.py" in test}
    assert {test.split("[")[0] for test in noted["torch_nan_gradient"]} == gradient_tests
    assert noted["torch_nan_gradient_when_causal"]

"""Running one case on one implementation and judging it against the oracle.

``run`` contains the implementation: an exception, a wrong shape or dtype, or a
NaN fails this case only, naming the clause it breaks. ``judge`` compares values
with the tolerance model and explains the worst element.
"""
from __future__ import annotations

import os
import traceback

import numpy as np
import pytest

from implementations import Implementation
from implementations._arrays import dtype_name

from . import oracle, tolerances
from .cases import Case, widen
from .report import CaseRecord, ConformanceFailure, failure_message, repro

RECORDS: list[CaseRecord] = []  # every judged case of the session, for the report
MAX_REPRO_ELEMENTS = 4096


LAST_UNSUPPORTED = [""]  # the latest reason, for a property test whose every case was unsupported


def declared_deviation(reason: str):
    """A failure the implementation declared (KNOWN_DEVIATIONS): xfail, or inside Hypothesis, drop the example."""
    LAST_UNSUPPORTED[0] = f"declared deviation: {reason}"
    from hypothesis import reject
    from hypothesis.control import currently_in_test_context

    if currently_in_test_context():
        reject()
    pytest.xfail(f"declared deviation: {reason}")


# Hypothesis gives up on a test only after about 460 rejected examples; an
# implementation that cannot run any case of a property (a module that only does
# self-attention, say) would pay for all of them. After this many unsupported
# examples with none supported, the property is skipped as unsupported. Strategies
# draw the common layouts (Dv == Dk, head width E / H) half the time, so a
# partially supporting implementation reaches it with probability below 1e-7.
UNSUPPORTED_BEFORE_SKIP = 20
SUPPORT_COUNTS = {"supported": 0, "unsupported": 0}  # of the running property test


def reset_support_counts() -> None:
    SUPPORT_COUNTS.update(supported=0, unsupported=0)


def unsupported(reason: str):
    """Report a case as unsupported: inside Hypothesis the example is rejected (the test goes on
    with others), elsewhere the test is skipped. Never a failure."""
    LAST_UNSUPPORTED[0] = reason
    from hypothesis import reject
    from hypothesis.control import currently_in_test_context

    if currently_in_test_context():
        SUPPORT_COUNTS["unsupported"] += 1
        if SUPPORT_COUNTS["supported"] == 0 and SUPPORT_COUNTS["unsupported"] >= UNSUPPORTED_BEFORE_SKIP:
            pytest.skip(f"unsupported: the first {UNSUPPORTED_BEFORE_SKIP} generated cases all were ({reason})")
        reject()
    pytest.skip(f"unsupported: {reason}")


def expected_output(case: Case, inputs: dict, policy: str = "zeros") -> np.ndarray:
    """The oracle's result on (rounded, widened) inputs."""
    a = widen(inputs)
    if case.op == "softmax":
        return oracle.softmax(a["x"], axis=a.get("axis", -1))
    if case.op == "sdpa":
        return oracle.sdpa(
            a["q"], a["k"], a["v"], a.get("mask"), a.get("is_causal", False), a.get("scale"),
            fully_masked_rows_policy=policy,
        )
    return oracle.multi_head_attention(
        a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"), a.get("is_causal", False),
        fully_masked_rows_policy=policy,
    )


def allowed_error(case: Case, inputs: dict, dtype: str, policy: str = "zeros") -> np.ndarray:
    a = widen(inputs)
    if case.op == "softmax":
        return tolerances.softmax_allowed(a["x"], a.get("axis", -1), dtype)
    if case.op == "sdpa":
        return tolerances.sdpa_allowed(
            a["q"], a["k"], a["v"], a.get("mask"), a.get("is_causal", False), a.get("scale"), dtype, policy
        )
    return tolerances.mha_allowed(
        a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"), a.get("is_causal", False), dtype
    )


# Clauses with a check of their own in the Judge (shape, dtype, non-finite output, exact zeros,
# fully masked rows). An error beyond the tolerance elsewhere is not theirs, even when a case lists
# one first: a fixture printed for its shape that is off in its values breaks the definition.
OWN_CHECK_CLAUSES = frozenset({"sdpa.output-shape", "sdpa.output-dtype", "sdpa.finite",
                               "softmax.masked-exact-zero", "mask.fully-masked-row"})
DEFINITION_CLAUSES = {"softmax": "softmax.definition", "sdpa": "sdpa.definition",
                      "multi_head_attention": "mha.projections"}


def accuracy_clause(case: Case) -> str:
    """The clause an error beyond the tolerance breaks: the case's first that is about values."""
    fallback = DEFINITION_CLAUSES.get(case.op, case.clauses[0])
    return next((c for c in case.clauses if c not in OWN_CHECK_CLAUSES), fallback)


class Judge:
    """Judges cases of one implementation on one device and dtype; knows how to word a verdict."""

    def __init__(self, impl: Implementation, dtype: str, device: str, test_name: str = ""):
        # pytest names the running test in PYTEST_CURRENT_TEST ("path::name[id] (call)").
        test_name = test_name or os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        self.impl, self.dtype, self.device, self.test_name = impl, dtype, device, test_name
        self._last_expected: tuple | None = None  # (inputs, policy, oracle output) of the latest case

    # ------------------------------------------------------------- plumbing
    def _snippet(self, case: Case, inputs: dict) -> str:
        size = sum(np.size(v) for v in inputs.values() if isinstance(v, np.ndarray))
        size += sum(np.size(x) for v in inputs.values() if isinstance(v, dict) for x in v.values())
        if case.notes.get("fixture"):
            return (
                "from conformance.test_fixtures import run_fixture_repro\n"
                f"run_fixture_repro({self.impl.spec!r}, {case.notes['fixture']!r}, {self.dtype!r}, {self.device!r})"
            )
        if size > MAX_REPRO_ELEMENTS:
            return f"(inputs too large to print: {size} elements; rerun the test id shown above)"
        return repro(self.impl.spec, case.op, inputs, self.dtype, self.device, self.impl.policy_for(inputs.get("mask")))

    def facts(self, case: Case, inputs: dict) -> dict:
        """What a declared deviation's ``when`` may look at."""
        mask = inputs.get("mask")
        a = widen(inputs)
        facts = {
            "op": case.op, "dtype": self.dtype, "device": self.device, "scale": inputs.get("scale"),
            "is_causal": bool(inputs.get("is_causal", False)),
            "mask_kind": "none" if mask is None else ("bool" if mask.dtype == np.bool_ else "float"),
            "fully_masked": False,
        }
        if case.op == "sdpa":
            facts.update(Lq=a["q"].shape[-2], Lk=a["k"].shape[-2])
            facts["fully_masked"] = bool(self._fully_masked_rows(case, inputs).any())
        return facts

    # --------------------------------------------- what the oracle says
    def policy(self, case: Case, inputs: dict) -> str:
        """The declared fully-masked-row policy that applies to this case."""
        return self.impl.policy_for(inputs.get("mask")) if case.op != "softmax" else "zeros"

    def _expected(self, case: Case, inputs: dict, policy: str) -> np.ndarray:
        """The oracle's output, computed once per case: the contract check and the verdict both need it."""
        last = self._last_expected
        if last is not None and last[0] is inputs and last[1] == policy:
            return last[2]
        want = expected_output(case, inputs, policy)
        self._last_expected = (inputs, policy, want)
        return want

    # LargeShapeJudge (conformance/test_large_shapes.py) overrides these three with
    # blocked versions that never build an (Lq, Lk) array; the verdicts stay here.
    def _expected_shape(self, case: Case, inputs: dict) -> tuple[int, ...]:
        return self._expected(case, inputs, self.policy(case, inputs)).shape

    def _fully_masked_rows(self, case: Case, inputs: dict) -> np.ndarray:
        """(B, Hq, Lq) boolean, sdpa only: the rows with no key to attend."""
        a = widen(inputs)
        return oracle.fully_masked_rows(a["q"], a["k"], a.get("mask"), bool(a.get("is_causal", False)))

    def _oracle(self, case: Case, inputs: dict, policy: str) -> tuple[np.ndarray, np.ndarray]:
        """(expected output, allowed error broadcast to it) under the fully-masked-rows policy."""
        want = self._expected(case, inputs, policy)
        return want, np.broadcast_to(allowed_error(case, inputs, self.dtype, policy), want.shape)

    def fail(self, clause: str, case: Case, inputs: dict, problem: str, worst: str = "", record=None):
        __tracebackhide__ = True
        reason = self.impl.declared_deviation(clause, self.facts(case, inputs))
        if reason:
            self.record(case, clause, "deviation", message=f"{problem} -- declared: {reason}")
            declared_deviation(f"{clause}: {reason}")
        message = failure_message(
            clause=clause,
            impl_name=self.impl.name,
            case_label=case.label,
            op=case.op,
            dtype=self.dtype,
            device=self.device,
            shapes=case.shapes(),
            mask_kind=case.mask_kind,
            problem=problem,
            worst=worst,
            snippet=self._snippet(case, inputs),
        )
        if record is None:
            record = self.record(case, clause, "failed")
        else:
            RECORDS.append(record)
        record.status, record.message = "failed", message
        raise ConformanceFailure(clause, message, record)

    def record(self, case: Case, clause: str, status: str, **figures) -> CaseRecord:
        rec = CaseRecord(
            test=self.test_name,
            implementation=self.impl.name,
            clause=clause,
            case=case.label,
            op=case.op,
            dtype=self.dtype,
            device=self.device,
            status=status,
            shapes={k: list(v) for k, v in case.shapes().items()},
            **figures,
        )
        RECORDS.append(rec)
        return rec

    # ------------------------------------------------------------------ run
    def require_support(self, case: Case, inputs: dict, op: str | None = None) -> None:
        """Report the case unsupported (never failed) if the implementation cannot run it."""
        reason = self.impl.unsupported_reason(op or case.op, inputs, self.dtype, self.device)
        if reason:
            self.record(case, case.clauses[0], "unsupported", message=reason)
            unsupported(reason)

    def not_implemented(self, case: Case, exc: NotImplementedError) -> None:
        """The implementation raised NotImplementedError for this case: unsupported, not failed."""
        self.record(case, case.clauses[0], "unsupported", message=str(exc))
        unsupported(f"{self.impl.name} raised NotImplementedError: {exc}")

    def run(self, case: Case, inputs: dict | None = None) -> tuple[np.ndarray, dict]:
        """Call the implementation on the case's inputs rounded to the dtype. Skips if unsupported."""
        inputs = case.rounded(self.dtype) if inputs is None else inputs
        self.require_support(case, inputs)
        __tracebackhide__ = True
        raised = None
        try:
            got = self.impl.call(case.op, case.arrays(inputs), case.options(), self.device)
        except NotImplementedError as exc:
            self.not_implemented(case, exc)
        except Exception as exc:  # contained: this case fails, the session goes on
            where = traceback.extract_tb(exc.__traceback__)[-1]
            raised = f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
        SUPPORT_COUNTS["supported"] += 1
        if raised:
            self.fail(case.clauses[0], case, inputs, f"the implementation raised {raised}")
        return self._check_contract(case, inputs, got), inputs

    def _check_contract(self, case: Case, inputs: dict, got) -> np.ndarray:
        __tracebackhide__ = True
        want_shape = self._expected_shape(case, inputs)
        if not isinstance(got, np.ndarray):
            self.fail("sdpa.output-shape", case, inputs, f"returned {type(got).__name__}, not an array")
        if got.shape != want_shape:
            clause = "mha.shapes" if case.op == "multi_head_attention" else "sdpa.output-shape"
            self.fail(clause, case, inputs, f"output shape {got.shape}, expected {want_shape}")
        if dtype_name(got.dtype) != self.dtype:
            self.fail(
                "sdpa.output-dtype", case, inputs,
                f"output dtype {dtype_name(got.dtype)}, expected {self.dtype} (the input dtype)",
            )
        return got.astype(np.float64)

    # ---------------------------------------------------------------- judge
    def judge(self, case: Case, got: np.ndarray, inputs: dict, clause: str | None = None) -> CaseRecord:
        """Compare with the oracle under the tolerance model and the declared fully-masked-row policy."""
        __tracebackhide__ = True
        # Passing cases count for the clause the case was drawn for; an error beyond the tolerance is
        # filed under a clause about values (accuracy_clause) unless the caller names one.
        failing_clause = clause or accuracy_clause(case)
        clause = clause or case.clauses[0]
        policy = self.policy(case, inputs)
        want, allowed = self._oracle(case, inputs, policy)
        want_nan = np.isnan(want)
        empty = np.zeros((), dtype=bool)
        if case.op == "sdpa":
            empty = self._fully_masked_rows(case, inputs)
            if empty.any():
                self._judge_fully_masked(case, inputs, got, want, allowed, empty, policy)
        bad = ~np.isfinite(got) & ~want_nan
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            # On large-magnitude inputs a NaN or inf is the overflow the large-inputs clause forbids.
            finite_clause = "softmax.large-inputs" if "softmax.large-inputs" in case.clauses else "sdpa.finite"
            self.fail(
                finite_clause, case, inputs,
                f"{int(bad.sum())} non-finite output element(s) where the oracle is finite",
                f"index {index}: got {got[index]}, oracle {want[index]:.9g}",
            )
        if case.op == "softmax":
            x = widen(inputs)["x"]
            leaked = np.isneginf(x) & (got != 0)
            if leaked.any():
                index = tuple(int(i) for i in np.argwhere(leaked)[0])
                self.fail(
                    "softmax.masked-exact-zero", case, inputs,
                    f"{int(leaked.sum())} element(s) with input -inf are not exactly 0",
                    f"index {index}: got {got[index]:.9g}",
                )
        error = np.where(want_nan, 0.0, np.abs(got - np.where(want_nan, 0.0, want)))
        ratio = np.where(allowed > 0, error / np.where(allowed > 0, allowed, 1.0), np.where(error > 0, np.inf, 0.0))
        worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
        max_error = float(error.max()) if error.size else 0.0
        figures = dict(
            max_abs_error=max_error,
            allowed=float(allowed[worst]) if ratio.size else 0.0,
            ratio=float(ratio[worst]) if ratio.size else 0.0,
        )
        status = "deviation" if policy != "zeros" and bool(empty.any()) else "passed"
        record = CaseRecord(
            test=self.test_name, implementation=self.impl.name, clause=clause, case=case.label, op=case.op,
            dtype=self.dtype, device=self.device, status=status,
            shapes={k: list(v) for k, v in case.shapes().items()}, **figures,
        )
        if ratio.size and ratio[worst] > 1.0:
            index = tuple(int(i) for i in worst)
            record.clause = failing_clause
            self.fail(
                failing_clause, case, inputs,
                f"max abs error {max_error:.3e} exceeds the allowed error "
                f"(worst element: error {error[worst]:.3e} > allowed {allowed[worst]:.3e}, "
                f"{ratio[worst]:.3g}x the {self.dtype} tolerance of spec/tolerances.yaml)",
                f"index {index}: got {got[worst]:.9g}, oracle {want[worst]:.9g}",
                record=record,
            )
        RECORDS.append(record)
        return record

    def _judge_fully_masked(self, case, inputs, got, want, allowed, empty, policy):
        __tracebackhide__ = True
        rows = np.broadcast_to(empty[..., None], got.shape)
        if policy == "nan":
            ok = np.isnan(got) | ~rows
        else:
            ok = ~rows | (np.abs(np.nan_to_num(got, nan=np.inf) - want) <= allowed)
        if not ok.all():
            index = tuple(int(i) for i in np.argwhere(~ok)[0])
            declared = f"declared FULLY_MASKED_ROWS={policy!r}" if policy != "zeros" else "the canonical 'zeros'"
            self.fail(
                "mask.fully-masked-row", case, inputs,
                f"{int(empty.sum())} fully masked row(s) do not follow {declared}",
                f"index {index}: got {got[index]:.9g}, policy gives {want[index]:.9g}",
            )

    def check(self, case: Case, clause: str | None = None) -> tuple[np.ndarray, dict]:
        """Run and judge in one step; returns the output (float64) and the rounded inputs."""
        __tracebackhide__ = True
        got, inputs = self.run(case)
        self.judge(case, got, inputs, clause)
        return got, inputs

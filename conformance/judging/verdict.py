"""The verdict on one case, its wording and its record: the Judge.

``Judge.judge`` compares an output with the float64 oracle under the tolerance model
(spec/tolerances.yaml), checks fully masked rows against the declared FULLY_MASKED_ROWS policy, and
explains the worst element; ``Judge.fail`` words a failure (clause, case, worst element, repro command),
turns it into a declared deviation where KNOWN_DEVIATIONS covers it, and records every verdict in
RECORDS for the summary and the report.

The Judge is one object per implementation, dtype and device. Its other two jobs have modules of
their own, mixed in here: calling the implementation safely (containment.py) and blaming the clause
at fault when a case fails because of a feature the test is not about (attribution.py). What the
case should give comes from expected.py, computed once per case (expected.Reference).
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case, widen
from attention_conformance.conformance.cases.support import LAST_UNSUPPORTED, SUPPORT_COUNTS, not_judged
from attention_conformance.conformance.judging.attribution import Attribution
from attention_conformance.conformance.judging.containment import Containment, HungEarlier, resource_exhausted
from attention_conformance.conformance.judging.evidence import MAX_INLINE_ELEMENTS, Evidence
from attention_conformance.conformance.judging.evidence import command as repro_command
from attention_conformance.conformance.judging.expected import (
    allowed_error,
    expected_output,
    fully_masked_causes,
    reference,
    sequence_fully_masked_rows,
    sequence_row_causes,
)
from attention_conformance.conformance.judging.messages import ConformanceFailure, failure_message, repro
from attention_conformance.conformance.judging.records import RECORDS, CaseRecord
from attention_conformance.conformance.reference import oracle
from attention_conformance.conformance.reference.output_forms import SEQUENCE_OPS, contract_output
from attention_conformance.implementations.contract import mask_cause
from attention_conformance.implementations.region import shape_facts
from attention_conformance.implementations.registry import Implementation

# --print-python inlines a case's arrays up to this many elements, else reads them from the repro file.
MAX_REPRO_ELEMENTS = MAX_INLINE_ELEMENTS


def breaks_order(records) -> dict[str, list[str]]:
    """Per implementation, the clauses its failed cases break, the one that failed on the smallest case first.

    Each failed record is filed under the clause at fault (Judge.judge blames a feature the
    test is not about when the case passes without it), so the first clause listed is the
    fault shown by the smallest input; ties go to the clause with more failed cases.
    """
    smallest: dict[str, dict[str, tuple[int, int]]] = {}
    for rec in records:
        if rec.status != "failed":
            continue
        size = sum(int(np.prod(shape)) for shape in (rec.shapes or {}).values())
        best, count = smallest.setdefault(rec.implementation, {}).get(rec.clause, (size, 0))
        smallest[rec.implementation][rec.clause] = (min(best, size), count + 1)
    return {name: sorted(found, key=lambda c: (found[c][0], -found[c][1], c)) for name, found in smallest.items()}


def _same_policy(a, b) -> bool:
    """Whether two Judge.policy values (a name, or names per row) are the same."""
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return a.shape == b.shape and bool(np.all(a == b))


def declared_deviation(reason: str):
    """A failure the implementation declared (KNOWN_DEVIATIONS): xfail, or inside Hypothesis, drop the example.

    A property whose first UNSUPPORTED_BEFORE_SKIP examples were all declared deviations, none judged, is skipped
    saying so, as one whose cases were all unsupported: Hypothesis would otherwise draw hundreds more before
    giving up (a float64 run of an implementation declaring float64_computed_in_float32, say), each with its call,
    oracle and attribution probes. Every deviation met is recorded.
    """
    LAST_UNSUPPORTED[0] = f"declared deviation: {reason}"
    not_judged(reason, "declared deviation", "deviation", "judged", pytest.xfail)


# Clauses with a check of their own in the Judge (shape, dtype, non-finite output, exact zeros,
# fully masked rows). An error beyond the tolerance elsewhere is not theirs, even when a case lists
# one first: a fixture printed for its shape that is off in its values breaks the definition.
OWN_CHECK_CLAUSES = frozenset({"sdpa.output-shape", "sdpa.output-dtype", "sdpa.finite",
                               "softmax.masked-exact-zero", "mask.fully-masked-row",
                               "sdpa.fp8-output-dtype"})


DEFINITION_CLAUSES = {"softmax": "softmax.definition", "sdpa": "sdpa.definition",
                      "multi_head_attention": "mha.projections", "sdpa_varlen": "varlen.definition",
                      "sdpa_paged": "paged.definition"}


ROW_OPS = ("sdpa", *SEQUENCE_OPS)  # operations whose results are judged row by row (fully masked rows, policies)


# A fixture's inputs rounded to a dtype are the same for every implementation: its oracle output and allowed error
# (under the same policy and the judge's other settings) are computed once per worker, not once per implementation
# (a fixture is judged by up to nine built-ins in each dtype). Keyed by the inputs' contents, so a case derived from
# a fixture (attribution's probes) is its own entry; read-only, so that no verdict can change them.
_FIXTURE_ORACLE: dict = {}


def _contents(value, digest) -> None:
    if isinstance(value, dict):
        for name in sorted(value):
            digest.update(name.encode())
            _contents(value[name], digest)
    elif isinstance(value, np.ndarray):
        digest.update(f"{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    else:
        digest.update(repr(value).encode())


def _shared_for_fixture(what: tuple, case: Case, inputs: dict, policy, compute) -> np.ndarray:
    if case.notes.get("fixture") is None:
        return compute()
    digest = hashlib.blake2b(case.op.encode(), digest_size=16)
    _contents(inputs, digest)
    _contents(policy if isinstance(policy, str) else np.asarray(policy), digest)
    key = (digest.digest(),) + what
    if key not in _FIXTURE_ORACLE:
        value = np.asarray(compute())
        value.setflags(write=False)
        _FIXTURE_ORACLE[key] = value
    return _FIXTURE_ORACLE[key]


def accuracy_clause(case: Case) -> str:
    """The clause an error beyond the tolerance breaks: the case's first that is about values."""
    fallback = DEFINITION_CLAUSES.get(case.op, case.clauses[0])
    return next((c for c in case.clauses if c not in OWN_CHECK_CLAUSES), fallback)


def exceeds_allowed(error: float, allowed: float, ratio: float, tolerance: str, largest: float) -> str:
    """The problem line of a value over its allowance: the worst element's error against what it was allowed (the
    element furthest over, by error / allowed), and the largest error where another element, allowed more, has it."""
    text = (f"error {error:.3e} exceeds the allowed error {allowed:.3e} ({ratio:.3g}x the {tolerance} of "
            "spec/tolerances.yaml) at the worst element (the furthest over its allowance)")
    if largest > error:
        text += f"; the largest error, {largest:.3e}, is at an element allowed more"
    return text


class Judge(Containment, Attribution):
    """Judges cases of one implementation on one device and dtype; knows how to word a verdict."""

    def __init__(self, impl: Implementation, dtype: str, device: str, test_name: str = ""):
        # pytest names the running test in PYTEST_CURRENT_TEST ("path::name[id] (call)").
        test_name = test_name or os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        self.impl, self.dtype, self.device, self.test_name = impl, dtype, device, test_name
        # float32 matmuls declared to run in TF32 on this device: the tolerance allows TF32 input rounding.
        self.tf32 = dtype == "float32" and impl.tf32_on(device)
        self.alignment = impl.sequence_alignment  # SEQUENCE_ALIGNMENT: sdpa_varlen's and sdpa_paged's oracle
        self._last_expected: tuple | None = None  # (inputs, policy, oracle output) of the latest case
        self._last_policy: tuple | None = None  # (inputs, policy) of the latest case

    # ------------------------------------------------------------- plumbing
    def _snippet(self, case: Case, inputs: dict, arrays_file: str | None = None) -> str:
        """A standalone script calling the implementation on the case and printing its error against the oracle
        (``attention-conformance repro ID --print-python``); ``arrays_file``: read the inputs from that repro file
        instead of printing them."""
        if case.notes.get("fixture"):
            return (
                "from attention_conformance.conformance.harness.replay import run_fixture_repro\n"
                f"run_fixture_repro({self.impl.spec!r}, {case.notes['fixture']!r}, {self.dtype!r}, {self.device!r})"
            )
        policy = self.policy(case, inputs)
        return repro(self.impl.spec, case.op, inputs, self.dtype, self.device,
                     policy if isinstance(policy, str) else contract_output(case.op, policy),
                     layout=self.impl.layout if self.impl.layout_inputs(case.op) else "bhld",
                     output_layout=self.impl.result_layout if self.impl.output_transposed(case.op) else "bhld",
                     arrays_file=arrays_file,
                     alignment=self.alignment if case.op in SEQUENCE_OPS else None)

    def replay(self, case: Case) -> None:
        """The verdict on ``case`` again, outside pytest (conformance/harness/replay.py, for a failure of a test whose
        arguments were not saved): run it and judge it against the oracle, as ``check`` does. A judge of another test
        (gradients, dropout) replays its own way."""
        __tracebackhide__ = True
        self.check(case)

    def facts(self, case: Case, inputs: dict) -> dict:
        """What a declared deviation's ``when`` may look at."""
        # The region's facts (shapes, mask kind, is_causal; sdpa's variant keywords) and what only a judge knows.
        facts = {"dtype": self.dtype, "device": self.device, "scale": inputs.get("scale"), "fully_masked": False,
                 **shape_facts(case.op, inputs)}
        if case.op in ROW_OPS:
            facts["fully_masked"] = bool(self._fully_masked_rows(case, inputs).any())
        elif case.op == "multi_head_attention":  # each head's rows (mha.variants: the key-removing keywords too)
            facts["fully_masked"] = bool(oracle.mha_fully_masked_rows(inputs).any())
        # What emptied those rows (FULLY_MASKED_CAUSES; expected.fully_masked_causes), sorted: () without one.
        causes = set(self.row_causes(case, inputs).ravel()) - {""} if facts["fully_masked"] else set()
        facts["fully_masked_causes"] = tuple(sorted(str(c) for c in causes))
        return facts

    def element(self, case: Case, inputs: dict, index: tuple) -> str:
        """How a verdict names one output element of the judge's form: its index, and for sdpa_varlen the index of
        the contract's (total_q, Hq, Dv) with the sequence and query row it belongs to."""
        if case.op != "sdpa_varlen" or len(index) != 4:
            return f"index {index}"
        token = int(index[2])
        starts = np.asarray(inputs["cu_seqlens_q"]).astype(np.int64)
        sequence = int(np.searchsorted(starts, token, side="right") - 1)
        return (f"index {(token, int(index[1]), int(index[3]))} of (total_q, Hq, Dv) (sequence {sequence}, its query "
                f"row {token - int(starts[sequence])}, head {int(index[1])})")

    def allowed(self, case: Case, inputs: dict, policy: str = "zeros") -> np.ndarray:
        """The allowed error of this case for this implementation, dtype and device (TF32 if declared)."""
        output_dtype = self.impl.output_dtype(self.dtype)
        return _shared_for_fixture(("allowed", self.dtype, self.tf32, self.alignment, output_dtype), case, inputs,
                                   policy,
                                   lambda: allowed_error(case, inputs, self.dtype, policy, tf32=self.tf32,
                                                         alignment=self.alignment, output_dtype=output_dtype))

    # --------------------------------------------- what the oracle says
    def policy(self, case: Case, inputs: dict):
        """The declared FULLY_MASKED_ROWS policy of this case's fully masked rows: one name when one policy covers
        them all (or there are none), else (B, Hq, Lq) names, each row's by its own cause ("zeros" on rows with a
        key). Only variant cases can mix causes (a window row beside a bool-masked one, say)."""
        if case.op == "softmax":
            return "zeros"
        if self.impl.uniform_policy is not None:
            return self.impl.uniform_policy
        last = self._last_policy
        if last is not None and last[0] is inputs:
            return last[1]
        policy = self._declared_policy(case, inputs)
        self._last_policy = (inputs, policy)
        return policy

    def _declared_policy(self, case: Case, inputs: dict):
        mask = inputs.get("mask")
        case_kind = mask_cause(mask)
        causes = self.row_causes(case, inputs)
        found = sorted(str(c) for c in set(causes.ravel()) - {""})
        if not found:
            # No row to apply it to; the mask kind's policy is what the older per-case form named.
            return "zeros" if callable(self.impl.fully_masked_rows) else self.impl.policy_for(mask, self.dtype)
        facts = self.facts(case, inputs) if callable(self.impl.fully_masked_rows) else {}
        by_cause = {cause: self.impl.row_policy(cause, case_kind, self.dtype, facts) for cause in found}
        if len(set(by_cause.values())) == 1:
            return next(iter(by_cause.values()))
        policy = np.full(causes.shape, "zeros", dtype="<U7")
        for cause, name in by_cause.items():
            policy[causes == cause] = name
        return policy

    def row_causes(self, case: Case, inputs: dict) -> np.ndarray:
        """(B, Hq, Lq) what emptied each fully masked row (expected.fully_masked_causes), "" on rows with a key."""
        if case.op == "sdpa":
            empty = self._fully_masked_rows(case, inputs)
            lq, lk = inputs["q"].shape[-2], inputs["k"].shape[-2]
            return fully_masked_causes(empty, lq, lk, inputs.get("mask"), bool(inputs.get("is_causal", False)),
                                       **oracle.variant_options(inputs))
        if case.op in SEQUENCE_OPS:
            return sequence_row_causes(case.op, inputs, self._fully_masked_rows(case, inputs), self.alignment)
        if case.op == "multi_head_attention":
            shapes = shape_facts(case.op, inputs)
            empty = oracle.mha_fully_masked_rows(inputs) & np.swapaxes(self.judged_rows(case, inputs), 1, 2)
            return fully_masked_causes(empty, shapes["Lq"], shapes["Lk"], inputs.get("mask"),
                                       bool(inputs.get("is_causal", False)), **oracle.variant_options(inputs))
        return np.full((), "")

    def declared_policy_rows(self, case: Case, inputs: dict) -> np.ndarray:
        """(B, Hq, Lq) boolean, sdpa: the fully masked rows whose declared policy is not the canonical 'zeros'."""
        if self.impl.uniform_policy == "zeros":
            return np.zeros((), dtype=bool)
        return self._fully_masked_rows(case, inputs) & (np.asarray(self.policy(case, inputs)) != "zeros")

    def _expected(self, case: Case, inputs: dict, policy: str) -> np.ndarray:
        """The oracle's output, computed once per case: the contract check and the verdict both need it."""
        last = self._last_expected
        if last is not None and last[0] is inputs and _same_policy(last[1], policy):
            return last[2]
        want = _shared_for_fixture(("expected", self.alignment), case, inputs, policy,
                                   lambda: expected_output(case, inputs, policy, self.alignment))
        self._last_expected = (inputs, policy, want)
        return want

    # LargeShapeJudge (conformance/test_large_shapes.py) overrides these three and specified_elements
    # with blocked versions that never build an (Lq, Lk) array; the verdicts stay here.
    def _expected_shape(self, case: Case, inputs: dict) -> tuple[int, ...]:
        return self._expected(case, inputs, self.policy(case, inputs)).shape

    def _fully_masked_rows(self, case: Case, inputs: dict) -> np.ndarray:
        """(B, Hq, Lq) boolean, sdpa (and sdpa_varlen, sdpa_paged in the judge's form): the rows with no key."""
        if case.op in SEQUENCE_OPS:
            return sequence_fully_masked_rows(case.op, inputs, self.alignment)
        return reference(case, inputs, self.alignment).fully_masked_rows() & self.judged_rows(case, inputs)

    def judged_rows(self, case: Case, inputs: dict) -> np.ndarray:
        """(B or 1, 1, Lq) boolean, sdpa: the rows a verdict looks at. Rows i >= query_lengths[b] are padding
        (sdpa.varlen): their values are unspecified, NaN and inf included, and never judged. multi_head_attention:
        (B or 1, Lq, 1), the rows of its (B, Lq, E_out) output (mha.variants)."""
        if case.op == "multi_head_attention":
            return oracle.mha_judged_rows(inputs["query"], inputs.get("query_lengths"))
        if case.op != "sdpa":
            return np.ones((), dtype=bool)
        return oracle.judged_rows(inputs["q"], inputs.get("query_lengths"))

    def _unjudged(self, case: Case, inputs: dict, want: np.ndarray) -> np.ndarray:
        """Output elements with nothing to check: the oracle has no value there (the 'nan' policy) or the row is
        padding."""
        padded = False
        if case.op == "sdpa":
            padded = ~np.broadcast_to(self.judged_rows(case, inputs)[..., None], want.shape)
        elif case.op == "multi_head_attention" and inputs.get("query_lengths") is not None:
            padded = ~np.broadcast_to(self.judged_rows(case, inputs), want.shape)
        return np.isnan(want) | padded

    def specified_elements(self, case: Case, inputs: dict) -> np.ndarray:
        """Boolean, broadcastable to the output: the elements the contract gives a value, which every result must
        give finite (Containment._check_finite).

        All but the oracle's NaN (rows of a fully masked query under a declared 'nan' policy, in sdpa and in MHA;
        a softmax slice of -inf only) and padding rows (sdpa.varlen). Elsewhere the oracle is finite: on finite
        inputs each output element is a convex combination of values of v (projected, for MHA), a softmax weight,
        or 0. Read from the oracle's output, which the contract check has already computed for the expected shape.
        """
        return ~self._unjudged(case, inputs, self._expected(case, inputs, self.policy(case, inputs)))

    def _oracle(self, case: Case, inputs: dict, policy: str) -> tuple[np.ndarray, np.ndarray]:
        """(expected output, allowed error broadcast to it) under the fully-masked-rows policy."""
        want = self._expected(case, inputs, policy)
        return want, np.broadcast_to(self.allowed(case, inputs, policy), want.shape)

    def fail(self, clause: str, case: Case, inputs: dict, problem: str, worst: str = "", record=None,
             stop: bool = False, drawn_for: str | None = None, attribute: bool = True, raised: bool = False):
        """Raise the verdict (ConformanceFailure; HungEarlier with ``stop``), unless it is a declared deviation.

        ``attribute``: a property's own check (a metamorphic relation, say) that fails on a case whose
        values are off only because of a feature the test is not about is filed under that feature's
        clause (surfaced_fault). ``drawn_for``: the clause the case was drawn for, when the failure is
        filed under another; a deviation declared for either covers it. ``raised``: the call raised (the problem
        says what), so a probe that passes shows the case runs without the feature, not that values were off.
        """
        __tracebackhide__ = True
        facts = None if stop else self.facts(case, inputs)
        reason = None if stop else self.impl.declared_deviation(clause, facts)
        # A deviation declared for the clause covers the failure whatever the attribution finds (the clause becomes
        # drawn_for): its probes, several calls and oracles a case, are spared.
        if attribute and not stop and record is None and clause not in OWN_CHECK_CLAUSES \
                and not clause.startswith("contract.") and not reason and not (raised and resource_exhausted(problem)):
            surfaced = self.fault_behind(clause, case, inputs)
            if surfaced:
                finding = "the same case runs and passes" if raised else \
                    "the case's values are off and the same case passes"
                problem += f"; {finding} {surfaced[1]}: the fault is {surfaced[0]}'s, surfaced in a check of {clause}"
                drawn_for, clause = clause, surfaced[0]
                reason = self.impl.declared_deviation(clause, facts)
        if not reason and drawn_for and drawn_for != clause and not stop:
            reason = self.impl.declared_deviation(drawn_for, facts)
        if reason:
            self.record(case, clause, "deviation", message=f"{problem} -- declared: {reason}")
            declared_deviation(f"{clause}: {reason}")
        # What its repro file will hold (written when the test ends, failure_block.py): a failure Hypothesis
        # shrinks past costs no file.
        evidence = Evidence.of(self, clause, case, problem, worst)
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
            repro_command=repro_command(evidence.id),
        )
        if record is None:
            record = self.record(case, clause, "failed")
        else:
            RECORDS.append(record)
        record.status, record.message = "failed", message
        if stop:
            raise HungEarlier(clause, message, record, evidence)
        raise ConformanceFailure(clause, message, record, evidence)

    def new_record(self, case: Case, clause: str, status: str, **figures) -> CaseRecord:
        """A record of this case, not yet kept (fail(record=...) keeps it with the verdict)."""
        return CaseRecord(
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

    def record(self, case: Case, clause: str, status: str, **figures) -> CaseRecord:
        rec = self.new_record(case, clause, status, **figures)
        RECORDS.append(rec)
        if status in ("passed", "failed"):
            SUPPORT_COUNTS["judged"] += 1
        return rec

    # ---------------------------------------------------------------- judge
    def judge(self, case: Case, got: np.ndarray, inputs: dict, clause: str | None = None) -> CaseRecord:
        """Compare with the oracle under the tolerance model and the declared fully-masked-row policy."""
        __tracebackhide__ = True
        # Passing cases count for the clause the case was drawn for; an error beyond the tolerance is
        # filed under a clause about values (accuracy_clause) unless the caller names one.
        explicit = clause
        failing_clause = clause or accuracy_clause(case)
        clause = clause or case.clauses[0]
        policy = self.policy(case, inputs)
        want, allowed = self._oracle(case, inputs, policy)
        want_nan = self._unjudged(case, inputs, want)  # padding rows (query_lengths) are not judged either
        empty = self._judge_specified_values(case, inputs, got, want, allowed, policy, ~want_nan)
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
        status = "deviation" if bool(np.any(empty & (np.asarray(policy) != "zeros"))) else "passed"
        record = self.new_record(case, clause, status, **figures)
        if ratio.size and ratio[worst] > 1.0:
            index = tuple(int(i) for i in worst)
            # Filed under the test's own clause only if no feature the test is not about explains it.
            # Not when a deviation declared for the clause drawn for covers it whatever the attribution finds.
            surfaced = self.surfaced_fault(case, inputs) \
                if explicit is None and not self.impl.declared_deviation(clause, self.facts(case, inputs)) else None
            blame = ""
            if surfaced:
                blame = (f"; the same case passes {surfaced[1]}: the fault is {surfaced[0]}'s, "
                         f"surfaced in a case drawn for {clause}")
                failing_clause = surfaced[0]
            elif explicit is None:
                blame = self.pair_partner(case)
            record.clause = failing_clause
            self.fail(
                failing_clause, case, inputs,
                exceeds_allowed(error[worst], allowed[worst], ratio[worst], f"{self.dtype} tolerance", max_error)
                + blame,
                f"{self.element(case, inputs, index)}: got {got[worst]:.9g}, oracle {want[worst]:.9g}",
                record=record, drawn_for=clause, attribute=False,
            )
        RECORDS.append(record)
        SUPPORT_COUNTS["judged"] += 1
        return record

    def _judge_specified_values(self, case: Case, inputs: dict, got: np.ndarray, want: np.ndarray,
                                allowed: np.ndarray, policy: str, specified: np.ndarray) -> np.ndarray:
        """Fully masked rows under the declared policy, then no NaN or inf where ``specified``; returns the (B, Hq, Lq)
        fully masked rows of an sdpa case (a 0-d False otherwise)."""
        __tracebackhide__ = True
        empty = np.zeros((), dtype=bool)
        if case.op in ROW_OPS:
            empty = self._fully_masked_rows(case, inputs)
            # Rows with keys wrong too: the fault is not the empty rows' policy (a kernel that dropped a window whose
            # left side passed every position was filed under mask.fully-masked-row, where the window and a mask
            # emptied a row); the verdict on the values, and its attribution, name it. Unless their error is one the
            # implementation declared (HF eager attention's float64 computed in float32, whose finfo(float64).min
            # becomes -inf there: its empty rows NaN were filed under the undeclarable sdpa.finite).
            if empty.any():
                yields = self._wrong_where_keys(got, want, allowed, empty, specified) \
                    and not self.impl.declared_deviation(accuracy_clause(case), self.facts(case, inputs))
                if not yields:
                    self._judge_fully_masked(case, inputs, got, want, allowed, empty, policy)
        bad = ~np.isfinite(got) & specified
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            # On large-magnitude inputs a NaN or inf is the overflow the large-inputs clause forbids, with an outlier
            # channel the one of the unscaled q.k.
            finite_clause = next((c for c in ("softmax.large-inputs", "sdpa.score-range") if c in case.clauses),
                                 "sdpa.finite")
            self.fail(
                finite_clause, case, inputs,
                f"{int(bad.sum())} non-finite output element(s) where the oracle is finite",
                f"{self.element(case, inputs, index)}: got {got[index]}, oracle {want[index]:.9g}", attribute=False,
            )
        return empty

    def judge_non_finite(self, case: Case, inputs: dict, got: np.ndarray, specified: np.ndarray) -> None:
        """The verdict on a result with a NaN or inf where ``specified`` (the contract check found it): the one
        ``judge`` gives, fully masked rows' own clause first, then sdpa.finite; raised at the contract check, before
        any property compares the result with anything, so that none can record a pass on it."""
        __tracebackhide__ = True
        policy = self.policy(case, inputs)
        want, allowed = self._oracle(case, inputs, policy)
        self._judge_specified_values(case, inputs, got, want, allowed, policy, specified)

    @staticmethod
    def _wrong_where_keys(got, want, allowed, empty, specified) -> bool:
        """Whether an output element of a row with keys (and specified) lies outside its allowance."""
        rows_with_keys = specified & ~np.broadcast_to(empty[..., None], got.shape)
        with np.errstate(invalid="ignore"):
            return bool(np.any(rows_with_keys & ~(np.abs(got - want) <= allowed)))

    def _judge_fully_masked(self, case, inputs, got, want, allowed, empty, policy):
        __tracebackhide__ = True
        rows = np.broadcast_to(empty[..., None], got.shape)
        nan_rows = np.asarray(policy)[..., None] == "nan"
        close = np.abs(np.nan_to_num(got, nan=np.inf) - want) <= allowed
        ok = ~rows | np.where(nan_rows, np.isnan(got), close)
        if not ok.all():
            index = tuple(int(i) for i in np.argwhere(~ok)[0])
            row_policy = str(np.broadcast_to(np.asarray(policy)[..., None], got.shape)[index])
            declared = f"declared FULLY_MASKED_ROWS {row_policy!r}" if row_policy != "zeros" \
                else "the canonical 'zeros'"
            causes = self.row_causes(case, inputs)
            cause = str(np.broadcast_to(causes[..., None], got.shape)[index]) if causes.ndim else ""
            problem = (f"{int(empty.sum())} fully masked row(s) do not follow the policy declared for them; the first, "
                       f"emptied by {cause or 'its mask'}, does not follow {declared}")
            clause = "mask.fully-masked-row"
            # A packed or paged case's rows without keys are where its sequences' alignment puts them: one that passes
            # against the other alignment is that clause's fault.
            misaligned = None
            if case.op in SEQUENCE_OPS:  # ... or, of a packed batch, how seqused_k is read
                misaligned = self._alignment_fault(case, drawn_for_it=True) \
                    or self._seqused_fault(case, drawn_for_it=True)
            if misaligned:
                clause, problem = misaligned[0], f"{problem}; the same case passes {misaligned[1]}"
            self.fail(clause, case, inputs, problem,
                      f"{self.element(case, inputs, index)}: got {got[index]:.9g}, policy gives {want[index]:.9g}",
                      drawn_for="mask.fully-masked-row" if misaligned else None)

    def check(self, case: Case, clause: str | None = None) -> tuple[np.ndarray, dict]:
        """Run and judge in one step; returns the output (float64) and the rounded inputs."""
        __tracebackhide__ = True
        got, inputs = self.run(case)
        self.judge(case, got, inputs, clause)
        return got, inputs

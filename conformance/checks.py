"""Running one case on one implementation and judging it against the oracle.

``run`` contains the implementation: an exception, a hang (a call past the call
time limit), a changed input, a result that is not an array, a wrong shape or
dtype, or a NaN fails this case only, naming the clause it breaks. ``judge``
compares values with the tolerance model and explains the worst element; an error
that disappears when a feature the test is not about is taken out of the case
(is_causal, the mask, the default scale, grouped kv heads) is blamed on that
feature's clause.
"""
from __future__ import annotations

import contextvars
import os
import threading
import time
import traceback

import numpy as np
import pytest

from attention_conformance.implementations import Implementation
from attention_conformance.implementations._arrays import ARRAY_KINDS, dtype_name
from attention_conformance.implementations._region import shape_facts

from . import oracle, tolerances
from .cases import Case, widen
from .report import CaseRecord, ConformanceFailure, failure_message, repro

RECORDS: list[CaseRecord] = []  # every judged case of the session, for the report
MAX_REPRO_ELEMENTS = 4096


LAST_UNSUPPORTED = [""]  # the latest reason, for a property test whose every case was unsupported

# ------------------------------------------------------------ the call time limit
# Every call of an implementation (Judge.run, gradients, dropout) runs in a daemon
# thread joined with this limit. A call past it fails its case as a hang, and the
# Implementation object is marked hung (``hung_on``): in this process its later
# calls fail at once, so Hypothesis's shrinking never waits on the hang again.
# Python cannot kill a thread; the hung one is left running in the background
# (a daemon: it does not keep the process alive). Each xdist worker learns of the
# hang on its own, once.
CALL_TIMEOUT_VARIABLE = "ATTENTION_CONFORMANCE_CALL_TIMEOUT"  # set by --call-timeout SECONDS
DEFAULT_CALL_TIMEOUT_S = 30.0
COMPILED_CALL_ALLOWANCE = 4  # implementations that compile per input signature (ARRAY="jax", COMPILED=True)
RESULT_CLAUSE = "contract.result-type"  # a call returns an array (and returns at all)
INPUTS_CLAUSE = "contract.inputs-unchanged"  # a call leaves its inputs as it got them


def call_timeout_s() -> float | None:
    """The call time limit in seconds ($ATTENTION_CONFORMANCE_CALL_TIMEOUT, default 30); None: no limit (0 or off)."""
    raw = os.environ.get(CALL_TIMEOUT_VARIABLE, "").strip().lower()
    if not raw:
        return DEFAULT_CALL_TIMEOUT_S
    if raw in ("0", "off", "none"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${CALL_TIMEOUT_VARIABLE}={raw!r}: seconds (a number), 0 or 'off' expected") from None
    return value if value > 0 else None


class ImplementationHung(Exception):
    """A call did not return within the call time limit (now, or on an earlier case: ``label``)."""

    def __init__(self, message: str, label: str, earlier: bool = False):
        self.label, self.earlier = label, earlier
        super().__init__(message)


class HungEarlier(BaseException):
    """The verdict on a case of an implementation that hung earlier, raised inside Hypothesis.

    Not an Exception: Hypothesis takes an Exception for a failure and re-runs hundreds of
    examples to shrink and explain it (about 15 s a property on the CI machine, every
    one of them failing at once here); a BaseException it lets through at once, and
    pytest still reports the test failed with this message.
    """

    def __init__(self, clause: str, message: str, record=None):
        self.clause, self.record = clause, record
        super().__init__(message)


_USE_THE_VARIABLE = object()


def call_with_limit(impl: Implementation, label: str, fn, *args, limit=_USE_THE_VARIABLE, **kwargs):
    """``fn(*args, **kwargs)`` (a call of ``impl``) under the call time limit, for case ``label``.

    Returns its result or re-raises its exception. Raises ImplementationHung if the
    call is still running after ``limit`` seconds (default: call_timeout_s()), or at
    once, without calling, if ``impl`` hung earlier in this process.
    """
    earlier = getattr(impl, "hung_on", None)
    if earlier is None:
        limit = call_timeout_s() if limit is _USE_THE_VARIABLE else limit
        if limit is not None and impl.compiled:
            # A first call per input signature compiles (inductor on a GPU machine busy with 16 workers took
            # over 30 s for torch_flex); a compiling implementation gets COMPILED_CALL_ALLOWANCE times the limit.
            limit *= COMPILED_CALL_ALLOWANCE
        if limit is None:
            return fn(*args, **kwargs)
        outcome = _call_in_thread(impl, label, limit, fn, args, kwargs)
        if "error" in outcome:
            raise outcome["error"]
        if "result" in outcome:
            return outcome["result"]
        message = (f"the call hung: no result within {limit:g} s (timed out; the limit is --call-timeout / "
                   f"${CALL_TIMEOUT_VARIABLE}, default {DEFAULT_CALL_TIMEOUT_S:g} s). {impl.name} is marked hung: its "
                   "later cases in this process fail at once")
    else:
        message = (f"{impl.name} hung earlier on case {earlier[0]} (no result within {earlier[1]:g} s, timed out): "
                   "not called again in this process, every later case fails at once")
    # One raise for both: Hypothesis then sees one failure (not two bugs) when it re-runs the example.
    raise ImplementationHung(message, impl.hung_on[0], earlier is not None)


def _call_in_thread(impl, label: str, limit: float, fn, args, kwargs) -> dict:
    """{"result": ...} or {"error": exc}; empty if the call was still running after ``limit`` (then ``impl`` is
    marked hung)."""
    outcome: dict = {}
    context = contextvars.copy_context()  # np.errstate and other context variables reach the call

    def target():
        try:
            outcome["result"] = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"attention-conformance call of {impl.name}", daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        thread.join(limit)
    except BaseException:  # pytest-timeout or Ctrl-C interrupted the wait: the call may still be running
        if thread.is_alive():
            impl.hung_on = (label, time.monotonic() - started)
        raise
    if thread.is_alive():
        impl.hung_on = (label, limit)
        return {}
    return outcome


def _copies(value):
    """The implementation's own copies of the inputs (dicts of arrays copied too)."""
    if isinstance(value, dict):
        return {key: _copies(item) for key, item in value.items()}
    return value.copy() if isinstance(value, np.ndarray) else value


def _flat(value, prefix: str = ""):
    """(name, array) pairs: "q", "mask", "params.w_q", ..."""
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict):
            yield from _flat(item, f"{name}.")
        elif item is not None:
            yield name, item


def _lookup(value: dict, name: str):
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _difference(original: np.ndarray, now) -> str | None:
    """How ``now`` differs from ``original`` (None: not at all)."""
    now = np.asarray(now)
    if now.shape != original.shape:
        return f"its shape changed from {original.shape} to {now.shape}"
    if now.dtype != original.dtype and dtype_name(now.dtype) != dtype_name(original.dtype):
        return f"its dtype changed from {dtype_name(original.dtype)} to {dtype_name(now.dtype)}"
    if original.dtype == np.bool_ or now.dtype == np.bool_:
        changed = original != now
    else:
        a, b = original.astype(np.float64), now.astype(np.float64)
        changed = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    if not changed.any():
        return None
    index = tuple(int(i) for i in np.argwhere(changed)[0])

    def show(value):
        return str(bool(value)) if isinstance(value, (bool, np.bool_)) else f"{float(value):.9g}"

    return (f"{int(changed.sum())} of {changed.size} element(s) changed in place "
            f"(index {index}: was {show(original[index])}, now {show(now[index])})")


def _is_array(value) -> bool:
    """An array of some framework (NumPy, torch, JAX): has a shape and a dtype, and is not a NumPy scalar."""
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic)


def _type_words(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, np.generic):
        return f"a NumPy scalar ({type(value).__name__})"
    return type(value).__name__


def _size(inputs: dict) -> int:
    return sum(int(np.size(array)) for _, array in _flat(inputs) if isinstance(array, np.ndarray))


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
            fully_masked_rows_policy=policy, **oracle.variant_options(a),
        )
    return oracle.multi_head_attention(
        a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"), a.get("is_causal", False),
        fully_masked_rows_policy=policy,
    )


def allowed_error(case: Case, inputs: dict, dtype: str, policy: str = "zeros", tf32: bool = False) -> np.ndarray:
    """The tolerance model's allowed error; ``tf32``: float32 matmuls declared to run in TF32 (FLOAT32_MATMUL)."""
    a = widen(inputs)
    if case.op == "softmax":
        return tolerances.softmax_allowed(a["x"], a.get("axis", -1), dtype)
    if case.op == "sdpa":
        return tolerances.sdpa_allowed(
            a["q"], a["k"], a["v"], a.get("mask"), a.get("is_causal", False), a.get("scale"), dtype, policy, tf32=tf32,
            **oracle.variant_options(a),
        )
    return tolerances.mha_allowed(
        a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"), a.get("is_causal", False), dtype,
        tf32=tf32,
    )


# Clauses with a check of their own in the Judge (shape, dtype, non-finite output, exact zeros,
# fully masked rows). An error beyond the tolerance elsewhere is not theirs, even when a case lists
# one first: a fixture printed for its shape that is off in its values breaks the definition.
OWN_CHECK_CLAUSES = frozenset({"sdpa.output-shape", "sdpa.output-dtype", "sdpa.finite",
                               "softmax.masked-exact-zero", "mask.fully-masked-row"})
# The variant keywords each variant clause is about: its own probe takes them out (a case that then
# passes keeps the failure with the clause, whatever else the case carries).
VARIANT_CLAUSE_KEYWORDS = {
    "sdpa.window": ("window",), "sdpa.softcap": ("softcap",), "sdpa.alibi": ("alibi_slopes",),
    "sdpa.query-offset": ("query_offset",), "sdpa.varlen": ("key_lengths", "query_lengths"),
    "sdpa.variant-order": ("softcap", "alibi_slopes", "window", "key_lengths", "query_offset"),
}
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
        # float32 matmuls declared to run in TF32 on this device: the tolerance allows TF32 input rounding.
        self.tf32 = dtype == "float32" and impl.tf32_on(device)
        self._last_expected: tuple | None = None  # (inputs, policy, oracle output) of the latest case

    # ------------------------------------------------------------- plumbing
    def _snippet(self, case: Case, inputs: dict) -> str:
        size = sum(np.size(v) for v in inputs.values() if isinstance(v, np.ndarray))
        size += sum(np.size(x) for v in inputs.values() if isinstance(v, dict) for x in v.values())
        if case.notes.get("fixture"):
            return (
                "from attention_conformance.conformance.test_fixtures import run_fixture_repro\n"
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
        facts.update({key: value for key, value in shape_facts(case.op, inputs).items() if key not in facts})
        if case.op == "sdpa":
            facts["fully_masked"] = bool(self._fully_masked_rows(case, inputs).any())
            # The variant keywords the case uses (README "The contract"), for a deviation's ``when``.
            facts["variants"] = tuple(sorted(oracle.variant_options(inputs)))
        elif case.op == "multi_head_attention":
            bias = oracle.attention_bias(a.get("mask"), facts["is_causal"], facts["Lq"], facts["Lk"])
            facts["fully_masked"] = bool(np.isneginf(bias).all(axis=-1).any())
        return facts

    def allowed(self, case: Case, inputs: dict, policy: str = "zeros") -> np.ndarray:
        """The allowed error of this case for this implementation, dtype and device (TF32 if declared)."""
        return allowed_error(case, inputs, self.dtype, policy, tf32=self.tf32)

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
        return oracle.fully_masked_rows(a["q"], a["k"], a.get("mask"), bool(a.get("is_causal", False)),
                                        **oracle.variant_options(a)) & self.judged_rows(case, inputs)

    def judged_rows(self, case: Case, inputs: dict) -> np.ndarray:
        """(B or 1, 1, Lq) boolean, sdpa: the rows a verdict looks at. Rows i >= query_lengths[b] are padding
        (sdpa.varlen): their values are unspecified, NaN and inf included, and never judged."""
        if case.op != "sdpa":
            return np.ones((), dtype=bool)
        return oracle.judged_rows(inputs["q"], inputs.get("query_lengths"))

    def _unjudged(self, case: Case, inputs: dict, want: np.ndarray) -> np.ndarray:
        """Output elements with nothing to check: the oracle has no value there (the 'nan' policy) or the row is padding."""
        padded = ~np.broadcast_to(self.judged_rows(case, inputs)[..., None], want.shape) if case.op == "sdpa" else False
        return np.isnan(want) | padded

    def _oracle(self, case: Case, inputs: dict, policy: str) -> tuple[np.ndarray, np.ndarray]:
        """(expected output, allowed error broadcast to it) under the fully-masked-rows policy."""
        want = self._expected(case, inputs, policy)
        return want, np.broadcast_to(self.allowed(case, inputs, policy), want.shape)

    def fail(self, clause: str, case: Case, inputs: dict, problem: str, worst: str = "", record=None,
             stop: bool = False, drawn_for: str | None = None, attribute: bool = True):
        """Raise the verdict (ConformanceFailure; HungEarlier with ``stop``), unless it is a declared deviation.

        ``attribute``: a property's own check (a metamorphic relation, say) that fails on a case whose
        values are off only because of a feature the test is not about is filed under that feature's
        clause (surfaced_fault). ``drawn_for``: the clause the case was drawn for, when the failure is
        filed under another; a deviation declared for either covers it.
        """
        __tracebackhide__ = True
        if attribute and not stop and record is None and clause not in OWN_CHECK_CLAUSES \
                and not clause.startswith("contract.") and case.op != "softmax" and not self._passes(case):
            surfaced = self.surfaced_fault(case, inputs)
            if surfaced and surfaced[0] != clause:
                problem += (f"; the case's values are off and the same case passes {surfaced[1]}: the fault is "
                            f"{surfaced[0]}'s, surfaced in a check of {clause}")
                drawn_for, clause = clause, surfaced[0]
        facts = None if stop else self.facts(case, inputs)
        reason = None if stop else self.impl.declared_deviation(clause, facts)
        if not reason and drawn_for and drawn_for != clause and not stop:
            reason = self.impl.declared_deviation(drawn_for, facts)
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
        if stop:
            raise HungEarlier(clause, message, record)
        raise ConformanceFailure(clause, message, record)

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

    def limited(self, case: Case, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, a call of the implementation, under the call time limit (call_with_limit).

        Raises ImplementationHung on a hang: catch it and call ``hung`` (outside the try
        body, so that the verdict is not taken for the implementation's own exception).
        """
        return call_with_limit(self.impl, case.label, fn, *args, limit=self.call_limit(), **kwargs)

    # Seconds a call may take; None: $ATTENTION_CONFORMANCE_CALL_TIMEOUT (--call-timeout, default 30 s).
    # A judge of slow cases (the large shapes) may set its own.
    call_timeout: float | None = None

    def call_limit(self) -> float | None:
        return self.call_timeout if self.call_timeout is not None else call_timeout_s()

    def hung(self, case: Case, inputs: dict, exc: ImplementationHung):
        """Fail the case as a hang (contract.result-type: the call returned nothing).

        Inside Hypothesis, once the implementation hung earlier, the verdict is a HungEarlier
        (not a failure Hypothesis would shrink and explain, re-running the test hundreds of times).
        """
        __tracebackhide__ = True
        from hypothesis.control import currently_in_test_context

        self.fail(RESULT_CLAUSE, case, inputs, str(exc), stop=exc.earlier and currently_in_test_context())

    def run(self, case: Case, inputs: dict | None = None) -> tuple[np.ndarray, dict]:
        """Call the implementation on the case's inputs rounded to the dtype. Skips if unsupported.

        The implementation gets copies of the inputs (the oracle keeps the originals); a
        changed input fails the case (contract.inputs-unchanged), as does a hang or a
        result that is not an array (contract.result-type).
        """
        inputs = case.rounded(self.dtype) if inputs is None else inputs
        self.require_support(case, inputs)
        __tracebackhide__ = True
        originals = case.arrays(inputs)
        given = _copies(originals)
        passed: dict = {}
        raised = None
        try:
            got = self.limited(case, self.impl.call_raw, case.op, given, case.options(), self.device, passed)
        except ImplementationHung as exc:
            self.hung(case, inputs, exc)
        except NotImplementedError as exc:
            self.not_implemented(case, exc)
        except Exception as exc:  # contained: this case fails, the session goes on
            where = traceback.extract_tb(exc.__traceback__)[-1]
            raised = f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
        SUPPORT_COUNTS["supported"] += 1
        if raised:
            clause, blame = case.clauses[0], ""
            surfaced = self.surfaced_fault(case, inputs)
            if surfaced:
                clause = surfaced[0]
                blame = f"; the same case runs and passes {surfaced[1]}: the fault is {clause}'s"
            self.fail(clause, case, inputs, f"the implementation raised {raised}{blame}",
                      drawn_for=case.clauses[0], attribute=False)
        self._check_inputs_unchanged(case, inputs, originals, given, passed)
        return self._check_contract(case, inputs, got), inputs

    def _check_inputs_unchanged(self, case: Case, inputs: dict, originals: dict, given: dict, passed: dict) -> None:
        """The copies the implementation got (and the framework arrays made of them) still equal the originals."""
        __tracebackhide__ = True
        kind = ARRAY_KINDS[self.impl.array]
        for name, original in _flat(originals):
            if not isinstance(original, np.ndarray):
                continue
            mine = _lookup(given, name)
            problem = _difference(original, mine)
            native = _lookup(passed, name)
            if problem is None and native is not None and native is not mine:
                try:
                    problem = _difference(original, kind.to_numpy(native))
                except Exception:  # noqa: BLE001 -- a framework array we cannot read back: nothing to compare
                    problem = None
            if problem:
                self.fail(INPUTS_CLAUSE, case, inputs,
                          f"mutated input {name}: {problem}. The judge kept its own copy, so this case's other "
                          "verdicts would use the original values; an implementation must not write to its inputs")

    def _check_contract(self, case: Case, inputs: dict, got) -> np.ndarray:
        """The result as the implementation returned it (or already converted): an array of the right shape and dtype."""
        __tracebackhide__ = True
        want_shape = self._expected_shape(case, inputs)
        if not _is_array(got):
            self.fail(RESULT_CLAUSE, case, inputs,
                      f"returned {_type_words(got)}, expected an array of shape {want_shape} "
                      f"({'a NumPy array' if self.impl.array == 'numpy' else f'ARRAY={self.impl.array!r}'})")
        if not isinstance(got, np.ndarray):
            got = ARRAY_KINDS[self.impl.array].to_numpy(got)
        if got.shape != want_shape:
            clause = "mha.shapes" if case.op == "multi_head_attention" else "sdpa.output-shape"
            self.fail(clause, case, inputs, f"output shape {got.shape}, expected {want_shape}", attribute=False)
        if dtype_name(got.dtype) != self.dtype:
            self.fail(
                "sdpa.output-dtype", case, inputs,
                f"output dtype {dtype_name(got.dtype)}, expected {self.dtype} (the input dtype)",
            )
        return got.astype(np.float64)

    # ------------------------------------------------------------ attribution
    # A case drawn for one clause carries other features (is_causal, a mask, the default
    # scale, grouped kv heads). When its values are off, each feature the test is not about
    # is taken out in turn (the math of the rest kept); if the case then passes, the fault
    # is that feature's, and the failure is filed under its clause, not the test's.
    DIAGNOSIS_MAX_ELEMENTS = 1 << 20

    def _variants(self, case: Case):
        """(clause at fault, how the case was changed, changed case), most telling first.

        First the changes that keep the math (the default scale passed explicitly, grouped kv
        heads repeated, the mask broadcast beforehand): a case that then passes convicts the
        implicit path, whatever else the case was drawn for (not the test's own clause, which
        keeps the failure anyway). Then features taken out (is_causal, the mask, Dv != Dk), each
        only if the case was not drawn for it.
        """
        about, own = set(case.clauses), case.clauses[0]
        inputs = case.inputs

        def derived(words, **changes):
            return Case(case.op, {**inputs, **changes}, case.clauses, f"{case.label} [{words}]", case.mask_kind,
                        case.notes)

        mask = inputs.get("mask")
        if case.op == "sdpa":
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
            if inputs.get("scale") is None and own != "sdpa.scale-default":
                yield ("sdpa.scale-default", "with scale=1/sqrt(Dk) passed explicitly",
                       derived("explicit default scale", scale=float(q.shape[-1]) ** -0.5))
            if q.shape[1] != k.shape[1] and own != "sdpa.gqa-mapping":
                group = q.shape[1] // k.shape[1]
                yield ("sdpa.gqa-mapping", "with the kv heads repeated to Hq beforehand",
                       derived("kv heads repeated", k=np.repeat(k, group, axis=1), v=np.repeat(v, group, axis=1)))
            target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            if mask is not None and mask.shape != target and own != "mask.broadcast":
                yield ("mask.broadcast", "with the mask broadcast to (B, Hq, Lq, Lk) beforehand",
                       derived("mask broadcast", mask=np.broadcast_to(mask, target).copy()))
        # With a query_offset the causal band is that clause's (sdpa.query-offset), not the top-left one's.
        causal_clause = "sdpa.query-offset" if inputs.get("query_offset") else "causal.top-left"
        if inputs.get("is_causal") and not any(c.startswith("causal.") for c in about) and causal_clause not in about:
            yield causal_clause, "without is_causal", derived("without is_causal", is_causal=False)
        if mask is not None and not any(c.startswith("mask.") or c.startswith("causal.") for c in about):
            own_mask = "mask.bool-true-attends" if mask.dtype == np.bool_ else "mask.float-additive"
            yield own_mask, "without the mask", derived("without the mask", mask=None)
        if case.op == "sdpa":
            q, v = inputs["q"], inputs["v"]
            if v.shape[-1] != q.shape[-1] and not about & {"sdpa.value-dim", "sdpa.output-shape"}:
                dk = q.shape[-1]
                same = np.concatenate([v] * -(-dk // v.shape[-1]), axis=-1)[..., :dk]
                yield "sdpa.value-dim", "with Dv = Dk", derived("Dv = Dk", v=same)

    def _passes(self, case: Case) -> bool:
        """Whether the implementation passes ``case`` (values within the tolerance); False when it cannot tell.

        Records nothing and never skips: a probe for the attribution only.
        """
        inputs = case.rounded(self.dtype)
        if self.impl.unsupported_reason(case.op, inputs, self.dtype, self.device):
            return False
        try:
            got = call_with_limit(self.impl, case.label, self.impl.call, case.op, _copies(case.arrays(inputs)),
                                  case.options(), self.device, limit=self.call_limit())
            policy = self.policy(case, inputs)
            want = expected_output(case, inputs, policy)
            if not _is_array(got) or got.shape != want.shape or dtype_name(got.dtype) != self.dtype:
                return False
            allowed = np.broadcast_to(self.allowed(case, inputs, policy), want.shape)
        except Exception:  # noqa: BLE001 -- raised or hung: no evidence either way
            return False
        got = np.asarray(got, dtype=np.float64)
        want_nan = self._unjudged(case, inputs, want)  # the "nan" policy's rows and padding rows: anything goes
        with np.errstate(invalid="ignore"):
            ok = want_nan | (np.isfinite(got) & (np.abs(got - np.where(want_nan, 0.0, want)) <= allowed))
        return bool(np.all(ok))

    def surfaced_fault(self, case: Case, inputs: dict) -> tuple[str, str] | None:
        """(clause, how) when the case passes with one feature the test is not about taken out."""
        if case.op == "softmax" or _size(inputs) > self.DIAGNOSIS_MAX_ELEMENTS or getattr(self.impl, "hung_on", None):
            return None
        own = self._own_probe(case)
        if own is not None and self._passes(own):
            return None  # the feature the case was drawn for is at fault: the failure stays with it
        for clause, how, variant in self._variants(case):
            if self._passes(variant):
                return clause, how
        return None

    @staticmethod
    def _own_probe(case: Case) -> Case | None:
        """The case without the feature of the clause it was drawn for (None: no such feature)."""
        own, inputs = case.clauses[0], case.inputs
        mask = inputs.get("mask")
        changes = None
        if own.startswith("causal.") and inputs.get("is_causal"):
            changes = {"is_causal": False}
        elif own.startswith("mask.") and mask is not None:
            changes = {"mask": None}
        elif case.op == "sdpa":
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
            if own == "sdpa.scale-default" and inputs.get("scale") is None:
                changes = {"scale": float(q.shape[-1]) ** -0.5}
            elif own == "sdpa.gqa-mapping" and q.shape[1] != k.shape[1]:
                group = q.shape[1] // k.shape[1]
                changes = {"k": np.repeat(k, group, axis=1), "v": np.repeat(v, group, axis=1)}
            elif own == "sdpa.value-dim" and v.shape[-1] != q.shape[-1]:
                dk = q.shape[-1]
                changes = {"v": np.concatenate([v] * -(-dk // v.shape[-1]), axis=-1)[..., :dk]}
        if changes is None and own in VARIANT_CLAUSE_KEYWORDS:
            names = [n for n in VARIANT_CLAUSE_KEYWORDS[own] if n in inputs]
            if names:
                changes = {n: oracle.VARIANT_DEFAULTS[n] for n in names}
        if changes is None:
            return None
        return Case(case.op, {**inputs, **changes}, case.clauses, f"{case.label} [own probe]", case.mask_kind,
                    case.notes)

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
                f"index {index}: got {got[index]}, oracle {want[index]:.9g}", attribute=False,
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
        record = self.new_record(case, clause, status, **figures)
        if ratio.size and ratio[worst] > 1.0:
            index = tuple(int(i) for i in worst)
            # Filed under the test's own clause only if no feature the test is not about explains it.
            surfaced = self.surfaced_fault(case, inputs) if explicit is None else None
            blame = ""
            if surfaced:
                blame = (f"; the same case passes {surfaced[1]}: the fault is {surfaced[0]}'s, "
                         f"surfaced in a case drawn for {clause}")
                failing_clause = surfaced[0]
            record.clause = failing_clause
            self.fail(
                failing_clause, case, inputs,
                f"max abs error {max_error:.3e} exceeds the allowed error "
                f"(worst element: error {error[worst]:.3e} > allowed {allowed[worst]:.3e}, "
                f"{ratio[worst]:.3g}x the {self.dtype} tolerance of spec/tolerances.yaml){blame}",
                f"index {index}: got {got[worst]:.9g}, oracle {want[worst]:.9g}",
                record=record, drawn_for=clause, attribute=False,
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

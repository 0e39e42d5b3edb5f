"""Containment: one call of an implementation, kept from harming the session or the verdict.

Whatever an implementation does on one case stays with that case: an exception, a hang (a call
past the call time limit), a write to its inputs, a result that is not an array or has the wrong
shape or dtype, a NaN or inf where the oracle's result is finite, each fails that case alone, naming
the clause it breaks, and the session goes on.
The implementation gets copies of the inputs, so the oracle and every later check read the values
it was given even if it wrote to them. A case the implementation cannot run (outside its region,
a keyword it lacks, NotImplementedError) is unsupported: skipped or rejected, never failed.

``Containment`` is the part of the Judge (verdict.py) that calls the implementation; it leaves the
wording and recording of a verdict (``fail``, ``record``), the oracle (``_expected_shape``) and the
attribution of a raised exception (``surfaced_fault``, attribution.py) to the rest of the Judge.
"""
from __future__ import annotations

import contextvars
import os
import queue
import threading
import time
import traceback

import numpy as np

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.support import SUPPORT_COUNTS, unsupported
from attention_conformance.conformance.judging.time_limit import running_test, waiting_for
from attention_conformance.conformance.reference.output_forms import canonical_output, contract_shape
from attention_conformance.implementations.arrays import ARRAY_KINDS, dtype_name
from attention_conformance.implementations.contract import LAYOUT_SHAPES
from attention_conformance.implementations.registry import Implementation

# The clause a wrong output shape breaks, by operation (sdpa.output-shape for sdpa).
SHAPE_CLAUSES = {"multi_head_attention": "mha.shapes", "sdpa_varlen": "varlen.output-shape",
                 "sdpa_paged": "paged.output-shape", "softmax": "softmax.output-shape"}


# ------------------------------------------------------------ the call time limit
# Every call of an implementation (Judge.run, gradients, dropout) runs in a daemon
# thread of that implementation's own (CallThread) and is waited for with this limit.
# A call past it fails its case as a hang, and the Implementation object is marked
# hung (``hung_on``): in this process its later calls fail at once, so Hypothesis's
# shrinking never waits on the hang again. Python cannot kill a thread; the hung one
# is left running in the background (a daemon: it does not keep the process alive).
# A call that was only slow returns in the end: the first call of a later test
# (never the same test, whose replays must see the same verdict) finds it returned
# and calls the implementation again. A correct torch implementation on a machine
# loaded by other processes took 20-55 s a call instead of 0.1-0.5 s (OpenMP threads
# spinning for busy cores): it failed its one case, not every later test as well.
# Each xdist worker learns of the hang on its own, once.
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


# Texts of an exception that ran out of memory or of another resource (torch, CUDA, Triton, XLA). A probe changes the
# case's shapes and so the kernel and its memory, and may fit where the case did not: its passing says nothing of a
# feature. An H100 run filed "CUDA driver error: out of memory" (flex at Dk 256, 16 workers on one GPU) under
# sdpa.gqa-mapping because the case with its kv heads repeated ran.
RESOURCE_ERRORS = ("out of memory", "outofmemoryerror", "out of resource", "resource_exhausted")


def resource_exhausted(problem: str) -> bool:
    """Whether a raised exception's text says a resource ran out (RESOURCE_ERRORS): such a failure is not attributed."""
    text = problem.lower()
    return any(marker in text for marker in RESOURCE_ERRORS)


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

    def __init__(self, clause: str, message: str, record=None, evidence=None):
        self.clause, self.record, self.evidence = clause, record, evidence
        super().__init__(message)


_USE_THE_VARIABLE = object()


def call_with_limit(impl: Implementation, label: str, fn, *args, limit=_USE_THE_VARIABLE, **kwargs):
    """``fn(*args, **kwargs)`` (a call of ``impl``) under the call time limit, for case ``label``.

    Returns its result or re-raises its exception. Raises ImplementationHung if the
    call is still running after ``limit`` seconds (default: call_timeout_s()), or at
    once, without calling, if ``impl`` hung earlier in this process.
    """
    earlier = getattr(impl, "hung_on", None)
    if earlier is not None and _returned_since(impl):
        earlier = impl.hung_on = None
    if earlier is None:
        limit = call_timeout_s() if limit is _USE_THE_VARIABLE else limit
        if limit is not None and impl.compiled:
            # A first call per input signature compiles (inductor on a GPU machine busy with 16 workers took
            # over 30 s for torch_flex); a compiling implementation gets COMPILED_CALL_ALLOWANCE times the limit.
            limit *= COMPILED_CALL_ALLOWANCE
        outcome = _call_in_thread(impl, label, limit, fn, args, kwargs)
        if "error" in outcome:
            refusal = impl.refusal(outcome["error"])
            if refusal:  # REFUSALS: the compiler refused the program, which is no wrong result
                raise NotImplementedError(refusal) from outcome["error"]
            raise outcome["error"]
        if "result" in outcome:
            return outcome["result"]
        message = (f"the call hung: no result within {limit:g} s (timed out; the limit is --call-timeout / "
                   f"${CALL_TIMEOUT_VARIABLE}, default {DEFAULT_CALL_TIMEOUT_S:g} s). {impl.name} is marked hung: its "
                   "later cases in this process fail at once until the call returns")
    else:
        message = (f"{impl.name} hung earlier on case {earlier[0]} (no result within {earlier[1]:g} s, timed out): "
                   "not called again in this process until that call returns, every case till then fails at once")
    # One raise for both: Hypothesis then sees one failure (not two bugs) when it re-runs the example.
    raise ImplementationHung(message, impl.hung_on[0], earlier is not None)


class CallThread:
    """The long-lived daemon thread one implementation's calls run in, one call at a time.

    A thread started per call cost 120 us of CPU and, in a loaded worker, a wait for
    it to start (15,024 calls a default run; the waits were 7.7 s of a warm run's py-spy
    samples). Thread-local state (torch's grad mode, JAX's config contexts)
    that a call leaves changed reaches only the same implementation's later calls,
    never another's. A hung call keeps its thread; the implementation is then marked
    hung and never called again in this process.
    """

    def __init__(self, impl):
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=f"attention-conformance calls of {impl.name}",
                                       daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            target, done = self.tasks.get()
            target()
            done.release()

    def submit(self, target) -> threading.Lock:
        """Run ``target`` in this thread; the returned lock is released when it has returned."""
        done = threading.Lock()
        done.acquire()
        self.tasks.put((target, done))
        return done


def _returned_since(impl) -> bool:
    """Whether the call ``impl`` hung on has returned since, seen from a test other than the one it hung in."""
    late = getattr(impl, "hung_call", None)
    if late is None or late[1] == running_test():
        return False
    return late[0].acquire(blocking=False)  # released when the call returned


def _call_thread(impl) -> CallThread:
    runner = getattr(impl, "call_thread", None)
    if runner is None:
        runner = impl.call_thread = CallThread(impl)
    return runner


def _call_in_thread(impl, label: str, limit: float | None, fn, args, kwargs) -> dict:
    """{"result": ...} or {"error": exc}; empty if the call was still running after ``limit`` (then ``impl`` is
    marked hung). Without a limit (--call-timeout 0) the call runs in this thread."""
    outcome: dict = {}
    context = contextvars.copy_context()  # np.errstate and other context variables reach the call

    def target():
        try:
            outcome["result"] = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller's thread
            outcome["error"] = exc

    if limit is None or threading.current_thread() is _call_thread(impl).thread:  # (or inside a call: under its limit)
        target()
        return outcome
    runner = _call_thread(impl)
    started = time.monotonic()
    done = runner.submit(target)
    waiting_for((impl.name, label, started))
    try:
        returned = done.acquire(timeout=limit)
    except BaseException:  # pytest-timeout or Ctrl-C interrupted the wait: the call may still be running
        if not done.acquire(blocking=False):
            impl.hung_on, impl.hung_call = (label, time.monotonic() - started), (done, running_test())
        raise
    finally:
        waiting_for(None)
    if not returned:
        impl.hung_on, impl.hung_call = (label, limit), (done, running_test())
        return {}
    return outcome


# ------------------------------------------------------------ the inputs and the result
# The implementation gets copies (``input_copies``); after the call each copy, and the framework array
# made of it, is compared with the original (``_difference``), so a write to an input is seen even
# when the framework shares memory with the copy it was handed.
def input_copies(value):
    """The implementation's own copies of the inputs (dicts of arrays copied too)."""
    if isinstance(value, dict):
        return {key: input_copies(item) for key, item in value.items()}
    return value.copy() if isinstance(value, np.ndarray) else value


def flat(value, prefix: str = ""):
    """(name, array) pairs: "q", "mask", "params.w_q", ..."""
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict):
            yield from flat(item, f"{name}.")
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
    if now.dtype == original.dtype and bool(np.all(original == now)):
        return None  # the common case, without widening copies (NaN inputs take the path below)
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


def _shown_path(filename: str) -> str:
    """A source file as a failure names it: relative to the current directory when inside it (shorter)."""
    try:
        return os.path.relpath(filename) if not os.path.relpath(filename).startswith("..") else filename
    except ValueError:  # another drive (Windows)
        return filename


def is_array(value) -> bool:
    """An array of some framework (NumPy, torch, JAX): has a shape and a dtype, and is not a NumPy scalar."""
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic)


def _type_words(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, np.generic):
        return f"a NumPy scalar ({type(value).__name__})"
    return type(value).__name__


class Containment:
    """Calls of the implementation for one case: under the call time limit, on copies of the inputs,
    with the result checked against the contract (an array of the expected shape and dtype, finite
    wherever the oracle is).

    A mixin of the Judge (judging.py), which supplies ``impl``, ``dtype``, ``device``, the verdicts
    (``fail``, ``record``, ``judge_non_finite``), what the oracle says (``_expected_shape``,
    ``specified_elements``) and ``surfaced_fault``.
    """

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
        given = input_copies(originals)
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
            raised = f"{type(exc).__name__}: {exc} (at {_shown_path(where.filename)}:{where.lineno})"
        SUPPORT_COUNTS["supported"] += 1
        if raised:
            clause, blame = case.clauses[0], ""
            surfaced = None if resource_exhausted(raised) else self.surfaced_fault(case, inputs)
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
        for name, original in flat(originals):
            if not isinstance(original, np.ndarray):
                continue
            mine = _lookup(given, name)
            problem = _difference(original, mine)
            native = _lookup(passed, name)
            if problem is None and native is not None and native is not mine:
                try:
                    problem = _difference(original, self.impl.from_layout(case.op, kind.to_numpy(native))
                                          if name in self.impl.layout_inputs(case.op) else kind.to_numpy(native))
                except Exception:  # noqa: BLE001 -- a framework array we cannot read back: nothing to compare
                    problem = None
            if problem:
                self.fail(INPUTS_CLAUSE, case, inputs,
                          f"mutated input {name}: {problem}. The judge kept its own copy, so this case's other "
                          "verdicts would use the original values; an implementation must not write to its inputs")

    def _check_contract(self, case: Case, inputs: dict, got) -> np.ndarray:
        """The result as the implementation returned it (or already converted): an array of the right shape and dtype,
        finite wherever the oracle is. Returns it as float64, in the suite's (B, H, L, D) whatever the LAYOUT."""
        __tracebackhide__ = True
        want_shape = self.impl.output_shape(case.op, contract_shape(case.op, self._expected_shape(case, inputs)))
        if not is_array(got):
            self.fail(RESULT_CLAUSE, case, inputs,
                      f"returned {_type_words(got)}, expected an array of shape {want_shape} "
                      f"({'a NumPy array' if self.impl.array == 'numpy' else f'ARRAY={self.impl.array!r}'})")
        if not isinstance(got, np.ndarray):
            got = ARRAY_KINDS[self.impl.array].to_numpy(got)
        if got.shape != want_shape:
            clause = SHAPE_CLAUSES.get(case.op, "sdpa.output-shape")
            which = "OUTPUT_LAYOUT" if self.impl.output_layout else "LAYOUT"
            in_layout = f" ({which} {self.impl.result_layout!r}: {LAYOUT_SHAPES[self.impl.result_layout]})" \
                if self.impl.output_transposed(case.op) else ""
            self.fail(clause, case, inputs, f"output shape {got.shape}, expected {want_shape}{in_layout}",
                      attribute=False)
        got = canonical_output(case.op, self.impl.output_from_layout(case.op, got))
        expected_dtype = self.impl.output_dtype(self.dtype)
        if dtype_name(got.dtype) != expected_dtype and expected_dtype != self.dtype:  # an 8-bit case
            self.fail(
                "sdpa.fp8-output-dtype", case, inputs,
                f"output dtype {dtype_name(got.dtype)}, expected {expected_dtype} (FP8_OUTPUT_DTYPE of {self.dtype} "
                f"inputs: {self.impl.name} declares {expected_dtype!r}, the default is bfloat16)",
            )
        if dtype_name(got.dtype) != expected_dtype:
            self.fail(
                "sdpa.output-dtype", case, inputs,
                f"output dtype {dtype_name(got.dtype)}, expected {self.dtype} (the input dtype)",
            )
        got = got.astype(np.float64)
        self._check_finite(case, inputs, got)
        return got

    def _check_finite(self, case: Case, inputs: dict, got: np.ndarray) -> None:
        """No check passes on non-finite output where the oracle is finite.

        A property that compares the implementation with itself (key permutation: NaN == NaN) or with a
        bound (NaN < low and NaN > high are both False) would otherwise record a pass on an all-NaN
        output; every result the suite obtains passes here first, so none can. Only the elements the
        contract leaves unspecified may be NaN or inf: rows of a fully masked query under a declared
        FULLY_MASKED_ROWS "nan", padding rows i >= query_lengths[b] (``specified_elements``). The verdict
        is the one ``judge`` would give (``judge_non_finite``): sdpa.finite, softmax.large-inputs on a case
        drawn for it, mask.fully-masked-row for a fully masked row; a declared deviation still applies.
        """
        __tracebackhide__ = True
        if np.isfinite(got).all():
            return  # the common case: no mask to compute
        specified = self.specified_elements(case, inputs)
        if (~np.isfinite(got) & specified).any():
            self.judge_non_finite(case, inputs, got, specified)

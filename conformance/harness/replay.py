"""``attention-conformance repro ID``: a failure's saved case (conformance/judging/evidence.py) loaded and replayed.

``replay`` loads the implementation (the saved --impl spec, or another one), rebuilds the arguments and runs the
property test's own body on them outside Hypothesis, so the verdict goes through the same calls, layout, dtype,
device, oracle and checks as in the run, a relation between two calls included. A test that drew its case some
other way (a fixture, a large shape, ``st.data()``) is replayed as the judge's verdict on the failed case (a
fixture's against its printed values too). ``python_script`` writes the failed case as a standalone script: the
call, the oracle and the error, arrays inline up to MAX_INLINE_ELEMENTS, else read from the .npz.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attention_conformance.conformance.cases.fixtures import fixtures
from attention_conformance.conformance.judging.evidence import (
    MAX_INLINE_ELEMENTS,
    READABLE_FORMATS,
    ReproError,
    resolve,
    stored_array,
    unoption,
)
from attention_conformance.conformance.judging.fixtures import fixture_judge, judge_fixture
from attention_conformance.conformance.judging.verdict import Judge


# ------------------------------------------------------------------ reading
@dataclass
class Saved:
    """A repro file read back."""

    path: Path
    meta: dict
    case: Any  # cases.Case: the failed case
    kwargs: dict | None  # the property test's arguments (impl left out), None when the call was not saved

    @property
    def id(self) -> str:
        return self.meta["id"]


def _rebuild_case(entry: dict, prefix: str, read):
    """The Case of a saved case ``entry``; ``read(entry, prefix, name)`` gives one of its arrays."""
    import ml_dtypes  # noqa: F401 -- registers bfloat16 with numpy for the casts below

    from attention_conformance.conformance.cases.case import Case

    inputs: dict[str, Any] = {}
    for full in entry["arrays"]:
        array = read(entry, prefix, full)
        if full in entry["cast"]:
            array = array.astype(entry["cast"][full])
        name, _, key = full.partition(".")
        if key:
            inputs.setdefault(name, {})[key] = array
        else:
            inputs[name] = array
    for name, value in entry["options"].items():
        inputs[name] = unoption(value)
    ordered = {name: inputs[name] for name in _input_order(entry) if name in inputs}
    notes = {key: unoption(value) for key, value in entry["notes"].items()}
    return Case(entry["op"], ordered, tuple(entry["clauses"]), entry["label"], entry["mask_kind"], notes)


def _input_order(entry: dict) -> list[str]:
    names = list(dict.fromkeys(full.partition(".")[0] for full in entry["arrays"]))
    return names + [name for name in entry["options"] if name not in names]


def load(path: Path) -> Saved:
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") not in READABLE_FORMATS:
                raise ReproError(f"{path}: repro format {meta.get('format')!r}, this suite reads "
                                 f"{' and '.join(map(str, READABLE_FORMATS))}")

            def read(entry, prefix, full):
                return stored_array(path, data, meta, entry, prefix, full)

            case = _rebuild_case(meta["case"], "case", read)
            kwargs = None
            if meta.get("call"):
                kwargs = {}
                for name, value in meta["call"]["kwargs"].items():
                    if isinstance(value, dict) and "case" in value:
                        kwargs[name] = _rebuild_case(value["case"], f"arg/{name}", read)
                    elif isinstance(value, dict) and value.get("implementation"):
                        kwargs[name] = None  # the implementation is loaded by the replay
                    else:
                        kwargs[name] = unoption(value)
    except (OSError, ValueError, KeyError) as exc:
        raise ReproError(f"{path}: not a repro file of this suite ({type(exc).__name__}: {exc})") from None
    return Saved(path, meta, case, kwargs)


# ------------------------------------------------------------------ replaying
def _inner_test(name: str):
    """The body of a property test (Hypothesis's inner test, below property_test and @given)."""
    function = resolve(name)
    while not hasattr(function, "hypothesis") and hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function.hypothesis.inner_test if hasattr(function, "hypothesis") else function


def replay(saved: Saved, impl) -> None:
    """Run the saved failure again on ``impl``: raises the verdict (ConformanceFailure), pytest's skip (not
    judged) or xfail (a declared deviation), or returns (passed)."""
    meta = saved.meta
    dtype, device = meta["dtype"], meta["device"]
    if saved.kwargs is not None:
        kwargs = {name: (impl if value is None and name == "impl" else value) for name, value in saved.kwargs.items()}
        _inner_test(meta["call"]["test"])(**kwargs)
        return
    try:
        judge_class = resolve(meta["judge"])
    except (ImportError, AttributeError):
        judge_class = Judge
    judge = judge_class(impl, dtype, device)
    if saved.case.notes.get("fixture"):  # a worked example: against the oracle and its printed values
        judge_fixture(judge, {fx.id: fx for fx in fixtures()}[saved.case.notes["fixture"]])
        return
    judge.replay(saved.case)


def python_script(saved: Saved, impl_spec: str | None = None) -> str:
    """A standalone script: the failed case's call, the oracle and the error (the judge's repro snippet)."""
    from attention_conformance.implementations.registry import load_implementation

    meta = saved.meta
    spec = impl_spec or meta["implementation"]["spec"]
    impl = load_implementation(spec)
    try:
        judge_class = resolve(meta["judge"])
    except (ImportError, AttributeError):
        judge_class = Judge
    judge = judge_class(impl, meta["dtype"], meta["device"])
    case = saved.case
    inputs = case.rounded(meta["dtype"])
    size = sum(int(np.size(value)) for value in _leaves(inputs))
    arrays = None if size <= MAX_INLINE_ELEMENTS else str(saved.path.resolve())
    header = [f"# attention-conformance repro {saved.id}: [{meta['clause']}] {meta['test'] or 'a judged case'}",
              f"# case {case.label}",
              f"# {meta['problem']}"]
    return "\n".join(header) + "\n" + judge._snippet(case, inputs, arrays_file=arrays) + "\n"


def _leaves(inputs: dict):
    for value in inputs.values():
        if isinstance(value, dict):
            yield from (item for item in value.values() if isinstance(item, np.ndarray))
        elif isinstance(value, np.ndarray):
            yield value


def replay_and_report(saved: Saved, impl_spec: str | None = None, out=print) -> int:
    """``attention-conformance repro``: replay ``saved`` and print the verdict; the exit status (1: it still fails,
    0: it passes or is not judged, 2: the replay itself raised)."""
    import traceback

    import pytest

    from attention_conformance.conformance.judging.containment import HungEarlier
    from attention_conformance.conformance.judging.messages import ConformanceFailure
    from attention_conformance.conformance.judging.records import RECORDS, REPRO_HEADING
    from attention_conformance.implementations.registry import load_implementation

    meta = saved.meta
    spec = impl_spec or meta["implementation"]["spec"]
    impl = load_implementation(spec)
    out(f"repro {saved.id} of {meta['test'] or 'a judged case'}, replayed on {spec} ({meta['device']}/{meta['dtype']})")
    before = len(RECORDS)
    try:
        replay(saved, impl)
    except (ConformanceFailure, HungEarlier) as failure:
        message = str(failure).split("\n  " + REPRO_HEADING)[0]
        out(f"FAILED {message}")
        if failure.clause != meta["clause"]:
            out(f"  (the run filed it under {meta['clause']})")
        return 1
    except pytest.skip.Exception as skipped:
        out(f"NOT JUDGED: {skipped.msg}")
        return 0
    except pytest.xfail.Exception as declared:
        out(f"DECLARED DEVIATION (xfail): {declared.msg}")
        return 0
    except Exception:  # noqa: BLE001 -- the replay itself broke: say so, never pass
        out("ERROR: the replay raised (not a verdict):\n" + traceback.format_exc())
        return 2
    judged = [rec for rec in RECORDS[before:] if rec.status in ("passed", "deviation")]
    ratios = [rec.ratio for rec in judged if rec.ratio is not None and math.isfinite(rec.ratio)]
    worst = f"; the largest error is {max(ratios):.3g}x the allowed error" if ratios else ""
    out(f"PASSED: {len(judged)} check(s) of the case within the tolerance{worst}")
    return 0


def run_fixture_repro(impl_spec: str, fixture_id: str, dtype: str, device: str) -> None:
    """Rerun one fixture on one implementation outside pytest, printing the verdict (a failure raises it)."""
    from attention_conformance.implementations.registry import load_implementation

    fx = {f.id: f for f in fixtures()}[fixture_id]
    judge_fixture(fixture_judge(fx, load_implementation(impl_spec), dtype, device), fx)
    print(f"{fixture_id}: passed on {impl_spec} {device}/{dtype}")

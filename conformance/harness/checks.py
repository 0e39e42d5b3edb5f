"""What every test module shares: a device present, a judge and a check of one case, two outputs that must agree,
a derived case, and why an implementation cannot run a property (``requires`` of property_test).
"""
from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.gradient_verdicts import GradientJudge
from attention_conformance.conformance.judging.lse_verdicts import LseJudge
from attention_conformance.conformance.judging.merge_verdicts import MergeJudge
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.implementations.arrays import ARRAY_KINDS, differentiable_kinds
from attention_conformance.implementations.contract import VARIANT_DEFAULTS, missing_keywords_message
from attention_conformance.implementations.registry import Implementation


def array_devices(array: str) -> tuple[str, ...]:
    """Every device the adapter of ``array`` can offer (present on this machine or not)."""
    return tuple(ARRAY_KINDS[array].DEVICES)


def absent_device_reason(impl: Implementation, device: str) -> str:
    return f"{device} is not available to {impl.name} ({impl.array}) on this machine"


def require_device(impl: Implementation, device: str) -> None:
    """Skip (with the reason) when the device is absent; imports the framework only now."""
    if device not in impl.devices():
        pytest.skip(absent_device_reason(impl, device))


def judge_for(impl, device, dtype):
    require_device(impl, device)
    return Judge(impl, dtype, device)


def check(impl, device, dtype, case: Case):
    return judge_for(impl, device, dtype).check(case)


def lse_judge_for(impl, device, dtype) -> LseJudge:
    require_device(impl, device)
    return LseJudge(impl, dtype, device)


def merge_judge_for(impl, device, dtype) -> MergeJudge:
    require_device(impl, device)
    return MergeJudge(impl, dtype, device)


# ---------------------------------------------------------------- metamorphic
def same_outputs(judge: Judge, case: Case, first, second, inputs, clause: str, what: str, allowed=None):
    """Two outputs that must agree to within twice the allowed error of the case (each may err by it)."""
    __tracebackhide__ = True
    if allowed is None:
        allowed = judge.allowed(case, inputs)
    allowed = 2 * np.broadcast_to(allowed, first.shape)
    both_nan = np.isnan(first) & np.isnan(second)
    error = np.where(both_nan, 0.0, np.abs(first - second))
    worst = np.unravel_index(int(np.argmax(error - allowed)), error.shape)
    if error[worst] > allowed[worst]:
        judge.fail(clause, case, inputs, f"{what}: outputs differ by {error[worst]:.3e} > allowed {allowed[worst]:.3e}",
                   f"index {tuple(int(i) for i in worst)}: {first[worst]:.9g} vs {second[worst]:.9g}")
    judge.record(case, clause, "passed", max_abs_error=float(error.max()), allowed=float(allowed[worst]))


def derived(case: Case, label: str, drop=(), **changes) -> Case:
    """The case with inputs changed (and those named in ``drop`` taken out), labelled for its repro."""
    inputs = {name: value for name, value in {**case.inputs, **changes}.items() if name not in drop}
    return Case(case.op, inputs, case.clauses, f"{case.label} [{label}]", case.mask_kind)


def needs_keywords(*keywords: str, combined=(), at_least: int = 0):
    """``requires`` of property_test: why ``impl`` cannot run a property using these keywords (None: it can).

    ``combined``: keywords the property adds where the implementation runs them (``optional`` of the strategy);
    ``at_least`` of them must be run. A property about one keyword needs that keyword alone: one that also needed
    query_offset would leave the window and ALiBi of an implementation without an offset (jax_dpa's) unjudged, and a
    kernel mapping ALiBi slopes to heads in the wrong GQA order would pass every forward property."""

    def reason(impl):
        if not impl.implements("sdpa"):
            return None  # the op mark reports the operation missing
        accepted = impl.accepted_keywords("sdpa")
        missing = [k for k in keywords if accepted is not None and k not in accepted]
        if missing:
            return f"unsupported: {missing_keywords_message(impl.name, 'sdpa', missing)}"
        undeclared = [k for k in keywords if k in VARIANT_DEFAULTS and not impl.region.allows_variant(k)]
        if undeclared:
            return (f"unsupported: {impl.name} declares variants {list(impl.region.variants)} in SUPPORTS, not "
                    f"{', '.join(repr(k) for k in undeclared)}")
        if sum(impl.runs_keyword("sdpa", "key_lengths" if k == "lengths" else k) for k in combined) < at_least:
            return (f"unsupported: {impl.name}.sdpa runs fewer than {at_least} of the variant keywords "
                    f"{', '.join(combined)} (signature and SUPPORTS)")
        return None

    return reason


def without_autodiff(impl) -> str | None:
    # Asked at collection, of the adapters registered then (an adapter registered by the module under test counts).
    if not ARRAY_KINDS[impl.array].DIFFERENTIABLE:
        kinds = " or ".join(repr(kind) for kind in differentiable_kinds())
        return f"gradients are checked for ARRAY {kinds}; {impl.name} has ARRAY {impl.array!r}"
    if not impl.gradients:
        return f"{impl.name} declares GRADIENTS = False (a forward-only sdpa)"
    return None


def needs_op_keywords(op: str, *keywords: str, any_of: bool = False):
    """``requires`` of property_test: why ``impl``'s ``op`` cannot run a property using these keywords (all of them,
    or with ``any_of`` one at least; None: it can)."""

    def reason(impl):
        if not impl.implements(op):
            return None  # the op mark reports the operation missing
        accepted = impl.accepted_keywords(op)
        runs = [k for k in keywords if (accepted is None or k in accepted) and impl.region.allows_variant(k)]
        if (any_of and runs) or (not any_of and len(runs) == len(keywords)):
            return None
        missing = [k for k in keywords if k not in runs]
        return f"unsupported: {missing_keywords_message(impl.name, op, missing)} (or SUPPORTS does not declare it)"

    return reason


def gradient_judge_for(impl, device, dtype) -> GradientJudge:
    require_device(impl, device)
    return GradientJudge(impl, dtype, device)

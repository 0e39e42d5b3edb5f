"""Every worked example of the source documents, on every implementation, device and dtype.

An example must reproduce the oracle (within the tolerance model) and, in float32
and float64, the printed values (within the digits printed). A counterexample must
be avoided: the implementation must not land within the fixture's tolerance of it.
"""
from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.conformance import agreement
from attention_conformance.conformance.cases import Case
from attention_conformance.conformance.checks import Judge
from attention_conformance.conformance.plugin import require_device
from attention_conformance.conformance.specdata import Fixture, fixtures, judged_elements, within_printed
from attention_conformance.conformance.tolerances import model

pytestmark = pytest.mark.conformance


def fixture_case(fx: Fixture) -> Case:
    mask = fx.inputs.get("mask")
    kind = "none" if mask is None else ("bool" if mask.dtype == np.bool_ else "float")
    if fx.inputs.get("is_causal"):
        kind += "+causal"
    return Case(op=fx.op, inputs=dict(fx.inputs), clauses=fx.clauses, label=fx.id, mask_kind=kind,
                notes={"fixture": fx.id})


def test_fixture(fixture_case: Fixture, impl, device, dtype):
    require_device(impl, device)
    judge_fixture(Judge(impl, dtype, device, f"test_fixture[{fixture_case.id}]"), fixture_case)


def judge_fixture(judge: Judge, fx: Fixture) -> None:
    """The fixture against the oracle and, in the dtypes of a direct comparison, its printed values (or away from
    its counterexample): the test's verdict, also replayed by `attention-conformance repro` (Judge.replay)."""
    __tracebackhide__ = True
    impl, device, dtype = judge.impl, judge.device, judge.dtype
    case = fixture_case(fx)
    got, inputs = judge.run(case)
    judge.judge(case, got, inputs)
    # Padding rows (sdpa.varlen) are unspecified: left out of the cross-backend agreement too.
    agreement.keep(case.label, impl.name, device, dtype, np.where(judged_elements(fx, got.shape), got, np.nan))
    if fx.expected is None or dtype not in model()["fixtures"]["direct_comparison_dtypes"]:
        return
    within = within_printed(fx, got)  # sdpa.varlen's padding rows are unspecified: not compared
    if fx.op == "sdpa":
        # Fully masked rows under a declared FULLY_MASKED_ROWS policy were judged by it above; a printed row of zeros
        # (the canonical policy) is not the reference for them.
        within |= np.broadcast_to(judge.declared_policy_rows(case, inputs)[..., None], got.shape)
    if fx.kind == "example" and not within.all():
        index = tuple(int(i) for i in np.argwhere(~within)[0])
        judge.fail(fx.clauses[0], case, inputs,
                   f"does not reproduce the printed values of {fx.document} ({fx.source}) within atol {fx.atol:g}",
                   f"index {index}: got {got[index]:.6g}, printed {fx.expected[index]:.6g}")
    if fx.kind == "counterexample" and within.all():
        judge.fail(fx.clauses[0], case, inputs,
                   f"reproduces the counterexample of {fx.document} ({fx.source}): {fx.description or 'a known wrong result'}")


def run_fixture_repro(impl_spec: str, fixture_id: str, dtype: str, device: str) -> None:
    """Rerun one fixture on one implementation outside pytest, printing the verdict (a failure raises it)."""
    from attention_conformance.implementations import load_implementation

    fx = {f.id: f for f in fixtures()}[fixture_id]
    judge_fixture(Judge(load_implementation(impl_spec), dtype, device), fx)
    print(f"{fixture_id}: passed on {impl_spec} {device}/{dtype}")

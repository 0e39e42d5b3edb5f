"""Judging a worked example of fixtures/: against the oracle and, in the dtypes of a direct comparison, against the
values its source document printed (or away from its counterexample).
"""
from __future__ import annotations

import numpy as np

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.fixtures import Fixture, judged_elements, within_printed
from attention_conformance.conformance.judging import agreement
from attention_conformance.conformance.judging.lse_verdicts import EMPTY_ROW_VALUES, OUTPUT_CLAUSES, LseJudge
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference.output_forms import SEQUENCE_OPS, contract_output
from attention_conformance.conformance.reference.tolerances import model


def fixture_case(fx: Fixture) -> Case:
    mask = fx.inputs.get("mask")
    kind = "none" if mask is None else ("bool" if mask.dtype == np.bool_ else "float")
    if fx.inputs.get("is_causal"):
        kind += "+causal"
    notes = {"fixture": fx.id}
    if fx.op in SEQUENCE_OPS:
        notes["alignment"] = fx.alignment
    return Case(op=fx.op, inputs=dict(fx.inputs), clauses=fx.clauses, label=fx.id, mask_kind=kind, notes=notes)


def fixture_judge(fx: Fixture, impl, dtype: str, device: str, test_name: str = "") -> Judge:
    """The judge of ``fx``: an LseJudge for a fixture that asks for the lse (return_lse), a Judge otherwise."""
    return (LseJudge if fx.inputs.get("return_lse") else Judge)(impl, dtype, device, test_name)


def judge_fixture(judge: Judge, fx: Fixture) -> None:
    """The fixture against the oracle and, in the dtypes of a direct comparison, its printed values (or away from
    its counterexample): the test's verdict, also replayed by `attention-conformance repro` (Judge.replay)."""
    __tracebackhide__ = True
    impl, device, dtype = judge.impl, judge.device, judge.dtype
    case = fixture_case(fx)
    got, inputs = judge.run(case)
    asks_lse = isinstance(judge, LseJudge) and bool(fx.inputs.get("return_lse"))
    judge.judge(case, got, inputs, OUTPUT_CLAUSES[fx.op] if asks_lse else None)
    if asks_lse:
        judge.judge_lse(case, inputs)
    # Padding rows (sdpa.varlen) are unspecified: left out of the cross-backend agreement too.
    agreement.keep(case.label, impl.name, device, dtype, np.where(judged_elements(fx, got.shape), got, np.nan))
    if fx.expected is None or dtype not in model()["fixtures"]["direct_comparison_dtypes"]:
        return
    if asks_lse and fx.expected_lse is not None:
        _judge_printed_lse(judge, fx, case, inputs)
    if fx.op in SEQUENCE_OPS and impl.sequence_alignment != fx.alignment:
        return  # printed for the other SEQUENCE_ALIGNMENT: judged against the oracle of its own above
    # Fully masked rows under a declared FULLY_MASKED_ROWS policy were judged by it above; a printed row of zeros
    # (the canonical policy) is not the reference for them.
    declared = np.broadcast_to(judge.declared_policy_rows(case, inputs)[..., None], got.shape) \
        if fx.op in ("sdpa", *SEQUENCE_OPS) else np.zeros(got.shape, dtype=bool)
    # A fixture's atol holds an IEEE float32 implementation's allowance (fixtures/README.md); one declared to compute
    # in TF32 (FLOAT32_MATMUL) is allowed its own beside it, as against the oracle (jax_dpa on an H200: 4.9e-5 off
    # the printed values of onnx-attention-4d-gqa-scaled, atol 3.4e-6). A counterexample keeps its own atol: a wider
    # one would only make a correct result look like it.
    tf32_example = judge.tf32 and fx.kind == "example"
    slack = contract_output(fx.op, np.broadcast_to(judge.allowed(case, inputs, judge.policy(case, inputs)),
                                                   got.shape)) if tf32_example else 0.0
    # The judge's form of sdpa_varlen's rows back to the contract's (total_q, Hq, Dv), as printed.
    got, declared = contract_output(fx.op, got), contract_output(fx.op, declared)
    within = within_printed(fx, got, slack) | declared  # sdpa.varlen's padding rows are unspecified: not compared
    if fx.kind == "example" and not within.all():
        index = tuple(int(i) for i in np.argwhere(~within)[0])
        plus = " plus its TF32 allowance" if tf32_example else ""
        judge.fail(fx.clauses[0], case, inputs,
                   f"does not reproduce the printed values of {fx.document} ({fx.source}) within atol {fx.atol:g}"
                   f"{plus}",
                   f"index {index}: got {got[index]:.6g}, printed {fx.expected[index]:.6g}")
    if fx.kind == "counterexample" and within.all():
        judge.fail(fx.clauses[0], case, inputs,
                   f"reproduces the counterexample of {fx.document} ({fx.source}): {fx.description or 'a known wrong result'}")


def _judge_printed_lse(judge: LseJudge, fx: Fixture, case: Case, inputs: dict) -> None:
    """The lse against the fixture's printed values (natural log, sink included, -inf without keys), put in the
    implementation's declared LSE_CONVENTION; a sink's example is compared only where the sink is counted."""
    __tracebackhide__ = True
    convention = judge.impl.lse_convention
    if "learnable_sink" in fx.inputs and convention["sink"] != "included":
        return  # the printed value counts the sink; the oracle judged the declared convention above
    printed = fx.expected_lse.copy()
    keyless = np.isneginf(printed)
    if convention["base"] == "2":
        printed = printed / np.log(2.0)
    if convention["empty_row"] == "unspecified":
        keyless_judged = np.zeros_like(keyless)
    else:
        keyless_judged = keyless
        printed = np.where(keyless, EMPTY_ROW_VALUES[convention["empty_row"]], printed)
    got, atol = judge.lse, fx.atol / (np.log(2.0) if convention["base"] == "2" else 1.0)
    with np.errstate(invalid="ignore"):
        within = np.where(keyless, ~keyless_judged | (got == printed) | (np.isnan(got) & np.isnan(printed)),
                          np.abs(got - np.where(keyless, 0.0, printed)) <= atol)
    if not within.all():
        index = tuple(int(i) for i in np.argwhere(~within)[0])
        base = " (base 2, as declared)" if convention["base"] == "2" else ""
        judge.fail(case.clauses[0], case, inputs,
                   f"does not reproduce the printed lse of {fx.document} ({fx.source}) within atol {fx.atol:g}{base}",
                   f"{judge.lse_row(case, inputs, index)}: got {got[index]:.10g}, printed {printed[index]:.10g}")

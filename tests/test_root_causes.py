"""One root cause per message (conformance/root_causes.py): the factors failures share become one line each."""
from __future__ import annotations

from attention_conformance.conformance.judging.records import CaseRecord
from attention_conformance.conformance.reporting.root_causes import factors, raised, root_causes

RAISES = ("  problem  the implementation raised RuntimeError: Explicit attn_mask should not be set when "
          "is_causal=True (at /x/wrapper.py:12)")


def record(status, label, clause="sdpa.definition", dtype="float32", message="", seed=[0]):
    seed[0] += 1  # distinct cases: distinct labels
    return CaseRecord(test=f"t[{clause}]", implementation="impl", clause=clause, op="sdpa", dtype=dtype,
                      device="cpu", status=status, case=f"{label} scores~unit seed={seed[0]}", message=message)


def label(mask="none", causal=False, scale="None", lq=3, lk=5, dk=8):
    return f"B1 Hq2/Hkv1 Lq{lq} Lk{lk} Dk{dk} Dv{dk} mask={mask}{' causal' if causal else ''} scale={scale}"


def test_failures_that_raise_the_same_exception_are_one_cause_with_the_condition_they_share():
    failing = [record("failed", label("float", True), clause=c, message=RAISES)
               for c in ("causal.top-left", "mask.broadcast", "mask.before-softmax", "causal.top-left")]
    passing = [record("passed", label("float")), record("passed", label("bool", True)), record("passed", label())]
    (cause,) = root_causes(failing + passing)
    assert cause.failures == 4
    assert cause.clauses == ("causal.top-left", "mask.broadcast", "mask.before-softmax")
    assert cause.description == ('raises RuntimeError "Explicit attn_mask should not be set when is_causal=True" '
                                 "whenever is_causal and a float mask")
    assert cause.line().startswith("impl cause: raises RuntimeError")


def test_value_failures_get_the_condition_met_by_most_of_them_and_by_no_passing_case():
    failing = ([record("failed", label(causal=True, scale="-1.0"), clause="sdpa.finite") for _ in range(5)]
               + [record("failed", label("bool-full", True, scale="-0.5"), clause="mask.fully-masked-row")])
    passing = ([record("passed", label(causal=True, scale="0.5")) for _ in range(5)]
               + [record("passed", label(scale="-1.0")) for _ in range(5)])
    (cause,) = root_causes(failing + passing)
    assert (cause.description, cause.failures) == ("is_causal and scale < 0", 6)
    assert cause.clauses == ("sdpa.finite", "mask.fully-masked-row")


def test_no_cause_is_named_where_cases_meeting_the_condition_mostly_pass():
    # Failures spread over conditions that passing cases meet as often: nothing shared is a cause.
    failing = [record("failed", label(lq=lq), dtype=dtype) for dtype, lq in (("float16", 3), ("float32", 9))]
    passing = [record("passed", label(lq=lq), dtype=dtype)
               for _ in range(3) for dtype in ("float16", "float32") for lq in (3, 9)]
    assert root_causes(failing + passing) == []


def test_hangs_and_the_cases_failed_at_once_after_them_are_one_cause_not_their_cases_factors():
    first = ("  problem  the call hung: no result within 30 s (timed out; the limit is --call-timeout). impl is "
             "marked hung: its later cases in this process fail at once until the call returns")
    later = ("  problem  impl hung earlier on case B1 Hq2/Hkv1 Lq3 (no result within 30 s, timed out): not called "
             "again in this process until that call returns")
    failing = ([record("failed", label(dk=256), clause="contract.result-type", message=first)]
               + [record("failed", label(dk=256, mask="float"), clause="contract.result-type", message=later)
                  for _ in range(6)])
    passing = [record("passed", label(dk=8)) for _ in range(4)]
    (cause,) = root_causes(failing + passing)
    assert cause.failures == 7 and cause.clauses == ("contract.result-type",)
    assert cause.description == ("the call hung (no result within the call time limit) on 1 case; 6 later cases "
                                 "were failed without a call while it ran")


def test_factors_read_the_label_and_a_derived_case_without_is_causal():
    found = factors(record("failed", label("float", True, scale="0.0", lq=7, lk=3)))
    assert {("mask+causal", "yes"), ("scale", "zero"), ("lengths", "Lq>Lk"), ("Dk", "8"), ("mask", "float"),
            ("dtype", "float32")} <= found
    derived = record("failed", label("bool", True) + " [no causal]")
    assert ("is_causal", "no") in factors(derived) and ("mask+causal", "yes") not in factors(derived)
    shifted = record("failed", label(causal=True) + " [+-7.0 on every score]")  # the shift adds a float mask
    assert {("mask", "float"), ("mask+causal", "yes")} <= factors(shifted)
    assert factors(record("failed", "fixture-id")) == {("dtype", "float32")}


def test_raised_reads_the_problem_line_with_numbers_as_placeholders():
    rec = record("failed", label(), message="[x] header\n  problem  computing the gradients raised ValueError: "
                 "head dim 12 not in (16, 32); the case passes without it")
    assert raised(rec) == 'ValueError "head dim <n> not in (<n>, <n>)"'
    assert raised(record("failed", label(), message="  problem  max error 3 > allowed 1")) is None


def test_a_plain_torch_sdpa_wrapper_has_two_causes_that_explain_every_failure(tmp_path):
    """README's example: a five-line wrapper of torch's sdpa, run as a user would. On torch 2.13 (CPU) it fails under
    three clauses for two reasons: a float mask with is_causal raises, is_causal with a negative scale gives NaN."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    pytest.importorskip("torch")
    root = Path(__file__).resolve().parents[1]
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "conformance", "--impl", "examples.torch_sdpa_wrapper",
                           "-p", "no:cacheprovider", "-q", "-n", "0", "--conformance-report", str(report)],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:]
    data = json.loads(report.read_text())
    failed = data["summary"]["examples_torch_sdpa_wrapper"]["failed"]
    causes = data["causes"]
    lines = [line for line in done.stdout.splitlines() if " cause: " in line]
    assert len(causes) == len(lines) == 2, lines
    assert sum(cause["failures"] for cause in causes) == failed
    assert any("raises RuntimeError" in cause["cause"] and "is_causal" in cause["cause"] for cause in causes)
    assert any(cause["cause"] == "is_causal and scale < 0" for cause in causes)


def test_hangs_the_per_test_limit_interrupted_are_counted_from_the_cases_that_name_them():
    """torch_flex on an H200: two calls were still compiling when the per-test limit stopped their tests (failed with
    the Timeout, no record of their own); the 80 cases after them named them. The summary had said "hung on 0 cases"."""
    later = ("  problem  impl hung earlier on case {} (no result within 85.5 s, timed out): not called again in this "
             "process until that call returns")
    failing = [record("failed", label(dk=256), clause="contract.result-type", message=later.format(earlier))
               for earlier in ("B1 Hq2/Hkv2 Lq65 Lk65 Dk256", "B2 Hq4/Hkv2 Lq1 Lk256 Dk192") for _ in range(3)]
    (cause,) = root_causes(failing)
    assert cause.description == ("the call hung (no result within the per-test time limit) on 2 cases; 6 later "
                                 "cases were failed without a call while it ran")


def test_an_exception_raised_for_grouped_kv_heads_only_is_named_so():
    """Keras 3.15.1's NumPy backend raised ValueError for every case with 1 < Hkv < Hq (its einsum cannot broadcast
    the groups): without the kv heads among the factors the cause read "when the default scale (73 of 79)"."""
    error = ("  problem  the implementation raised ValueError: operands could not be broadcast together with remapped "
             "shapes [original->remapped]: (4,2,3)->(4,2,3)")

    def heads(hq, hkv, scale="None"):
        return label(scale=scale).replace("Hq2/Hkv1", f"Hq{hq}/Hkv{hkv}")

    failing = ([record("failed", heads(4, 2), message=error) for _ in range(5)]
               + [record("failed", heads(6, 2, scale="-0.35"), message=error)])
    passing = [record("passed", heads(4, 1)), record("passed", heads(4, 4)), record("passed", heads(2, 2, "0.5"))]
    (cause,) = root_causes(failing + passing)
    assert cause.description.endswith("whenever 1 < Hkv < Hq (grouped kv heads)"), cause.description
    assert ("kv", "one") in factors(passing[0]) and ("kv", "full") in factors(passing[1])
    # A refusal it may document: the line names the declaration that makes such cases unsupported (Keras's other
    # defects were hidden behind it: every property's first corner is grouped).
    assert cause.declare == '"gqa": False' and 'SUPPORTS {"gqa": False} makes them unsupported' in cause.line()
    assert cause.as_dict()["declare"] == '"gqa": False'
    import json
    from pathlib import Path

    import jsonschema

    schema = json.loads((Path(__file__).resolve().parents[1] / "docs" / "report-schema.json").read_text())
    jsonschema.validate(cause.as_dict(), {"$defs": schema["$defs"], "$ref": "#/$defs/cause"})


def test_a_cause_of_two_factors_or_of_values_names_no_declaration():
    failing = [record("failed", label("float", True), clause=c, message=RAISES)
               for c in ("causal.top-left", "mask.broadcast")]
    (cause,) = root_causes(failing + [record("passed", label("float")), record("passed", label("bool", True))])
    assert not cause.declare and "SUPPORTS" not in cause.line() and "declare" not in cause.as_dict()
    values = [record("failed", label(causal=True, scale="-1.0"), clause="sdpa.finite") for _ in range(3)]
    assert not any(c.declare for c in root_causes(values + [record("passed", label())]))


def test_multi_head_attention_failures_get_the_projection_bias_they_share():
    """An independent module added the in-projection bias to q only (b_v dropped): 31 failures under 9 clauses and no
    cause line, since only sdpa labels were read. Its cases with in-projection biases fail, the others pass."""
    def mha(bias, h=2, causal=False):
        return f"B2 H{h} Lq3 Lk5 E4 E_kv4 Dk2 Dv2 bias={bias} mask=none{' causal' if causal else ''}"

    failing = [record("failed", mha(b, causal=c), clause=cl) for b, c, cl in
               (("input", False, "mha.projections"), ("all", True, "causal.top-left"),
                ("all", False, "mha.head-split"))]
    passing = [record("passed", mha(b)) for b in ("none", "output", "none")]
    (cause,) = root_causes(failing + passing)
    assert cause.description == "in-projection biases" and cause.failures == 3, cause.description
    assert ("heads", "several") in factors(passing[0]) and ("kv_width", "same") in factors(passing[0])


def test_a_refusal_where_dv_differs_from_dk_is_named_with_it():
    """torch 2.13 (CPU) raises for a mask with is_causal only where Dv != Dk: a run that drew a boolean such case and
    a passing float one with Dv = Dk named no condition (CI, 2026-11-27), which made README's example flaky."""
    def dims(mask, dv):
        return label(mask, True).replace("Dv8", f"Dv{dv}")

    failing = [record("failed", dims(m, 6), message=RAISES) for m in ("float", "bool-full", "float")]
    passing = [record("passed", dims("float", 8)), record("passed", dims("bool-full", 8)),
               record("passed", dims("none", 6))]
    (cause,) = root_causes(failing + passing)
    assert cause.description.endswith("whenever mask and is_causal are both given and Dv != Dk"), cause.description

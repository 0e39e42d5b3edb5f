"""The conformance report, end to end: `pytest --conformance-report PATH` as a user runs it.

The JSON must validate against docs/report-schema.json and the HTML page beside it
must carry the clause matrix, the plot and, for a broken implementation, the
failure table. The passing run is the whole conformance suite on
examples.my_attention (about 12 s); the failing one is restricted to the fixtures
(about 7 s), as Hypothesis spends long shrinking the wrong-axis softmax's failures.
"""
from __future__ import annotations

import html
import importlib.util
import json
import os
import subprocess
import sys

import jsonschema
import pytest

from conformance import html_report
from conformance.specdata import ROOT, clauses

pytestmark = pytest.mark.selfcheck

SCHEMA = json.loads((ROOT / "docs" / "report-schema.json").read_text())
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def run_with_report(tmp_path, impl: str, *args: str, name: str = "r"):
    environment = {**os.environ}
    for variable in ("PYTEST_XDIST_WORKER", "ATTENTION_CONFORMANCE_IMPL", "PYTEST_ADDOPTS"):
        environment.pop(variable, None)
    report = tmp_path / f"{name}.json"
    command = [sys.executable, "-m", "pytest", "conformance", "-q", "-n", "0", "-p", "no:cacheprovider", "--impl", impl,
               "--hypothesis-profile", "dev", "--conformance-report", str(report), "-W", "ignore::DeprecationWarning",
               *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=110, env=environment)
    return done, report, report.with_suffix(".html")


def validate(report: dict) -> None:
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(report), key=lambda e: list(e.absolute_path))
    assert not errors, "the report does not match docs/report-schema.json (update the schema and docs/report.md):\n" + \
        "\n".join(f"  at {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}" for e in errors[:10])


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_a_passing_run_writes_a_valid_report_and_page(tmp_path):
    done, json_path, html_path = run_with_report(tmp_path, "examples.my_attention")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(json_path.read_text())
    validate(report)
    assert report["exit_status"] == 0
    assert [d["name"] for d in report["implementations"]] == ["examples_my_attention"]
    counts = report["summary"]["examples_my_attention"]
    assert counts.get("passed", 0) > 0 and not counts.get("failed")
    assert {c["clause"] for c in report["cases"]} >= {"sdpa.definition", "sdpa.scale-default", "causal.top-left",
                                                      "sdpa.gqa-mapping", "mask.fully-masked-row"}
    assert any(c["max_abs_error"] is not None and c["allowed"] for c in report["cases"])

    page = html_path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "Clauses × implementations" in page and "examples_my_attention" in page
    for clause_id in clauses():  # every clause of the spec is a row, run or not
        assert f'id="clause-{html.escape(clause_id)}"' in page
    assert "<link " not in page and "<script" not in page  # self-contained, nothing to fetch
    if HAS_MATPLOTLIB:
        assert '<img class="plot"' in page and "data:image/png;base64," in page
    else:
        assert "matplotlib is not installed" in page
    assert "No judged case failed" in page


def test_a_failing_run_lists_the_failures_in_both_files(tmp_path):
    done, json_path, html_path = run_with_report(tmp_path, "examples.wrong_axis_softmax", "-k", "test_fixture")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(json_path.read_text())
    validate(report)
    assert report["exit_status"] == 1
    failed = [c for c in report["cases"] if c["status"] == "failed"]
    assert {c["clause"] for c in failed} & {"softmax.last-axis", "softmax.definition"}, failed[:3]
    assert all(c["message"].startswith(f"[{c['clause']}]") for c in failed)

    page = html_path.read_text(encoding="utf-8")
    assert "<h2>Failures</h2>" in page and 'class="failures"' in page
    first = failed[0]
    assert f"<pre>{html.escape(first['message'].splitlines()[0])}" in page  # the full message, escaped, in <pre>
    assert "repro (run from the repository root)" in page


def test_the_page_escapes_text_and_survives_without_matplotlib(tmp_path, monkeypatch):
    """Every string from an implementation or a message is escaped; without matplotlib the page says so."""
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)  # makes the import fail
    evil = "<script>alert('x')</script>"
    report = {
        "schema_version": 1,
        "suite": {"name": "attention-conformance", "version": "0.1.0", "commit": None},
        "exit_status": 1,
        "environment": {"versions": {"python": "3.11.7", "torch": None}, "devices": {"cpu": "x86_64"},
                        "platform": "Linux"},
        "implementations": [{
            "name": evil, "spec": "m", "array": "numpy", "dtypes": {"cpu": ["float32"], "cuda": []},
            "devices": ["cpu"], "operations": {"softmax": False, "sdpa": True, "multi_head_attention": False},
            "fully_masked_rows": {"bool": "uniform", "float": "nan"},
            "known_deviations": [{"clause": "sdpa.finite", "reason": evil}], "skip_reason": None,
        }],
        "summary": {evil: {"failed": 1, "passed": 1, "deviation": 1}},
        "cases": [
            {"test": "t", "implementation": evil, "clause": "sdpa.definition", "case": evil, "op": "sdpa",
             "dtype": "float32", "device": "cpu", "status": "failed", "max_abs_error": 1.0, "allowed": 1e-6,
             "ratio": float("inf"), "message": f"[sdpa.definition] {evil}", "shapes": {"q": [1, 1, 2, 3]}},
            {"test": "", "implementation": evil, "clause": "sdpa.definition", "case": "c", "op": "sdpa",
             "dtype": "float32", "device": "cpu", "status": "passed", "max_abs_error": 0.0, "allowed": 1e-6,
             "ratio": 0.0, "message": "", "shapes": {}},
            {"test": "", "implementation": evil, "clause": "mask.fully-masked-row", "case": "c", "op": "sdpa",
             "dtype": "float32", "device": "cpu", "status": "deviation", "max_abs_error": None, "allowed": None,
             "ratio": None, "message": evil, "shapes": {}},
        ],
        "agreement": [{"dtype": "float32", "a": f"{evil}@cpu", "b": "other@cpu", "cases": 2, "max_abs_diff": 1e-7,
                       "max_ulp": 3}],
    }
    validate(report)
    target = tmp_path / "page.html"
    html_report.write(report, target)
    page = target.read_text(encoding="utf-8")
    assert "<script" not in page
    assert html.escape(evil) in page
    assert "matplotlib is not installed" in page and "<img" not in page
    assert "bool mask: uniform, float mask: nan" in page and "cpu: float32; cuda: none" in page
    assert "1.000e-07 / 3 ulp" in page


def test_a_report_under_xdist_has_the_workers_records(tmp_path):
    done, json_path, _ = run_with_report(tmp_path, "examples.my_attention", "-k", "test_fixture", "-n", "1")
    assert done.returncode == 0, done.stdout[-3000:]
    report = json.loads(json_path.read_text())
    assert report["summary"].get("examples_my_attention", {}).get("passed", 0) > 0

"""The conformance report, end to end: `pytest --conformance-report PATH` as a user runs it.

The JSON must validate against docs/report-schema.json and the HTML page beside it
must carry the clause matrix, the plot and, for a broken implementation, the
failure table. The passing run is the whole conformance suite on
examples.my_attention (about 12 s); the failing one is restricted to the fixtures
(about 7 s), as Hypothesis spends long shrinking the wrong-axis softmax's failures.
"""
from __future__ import annotations

import gzip
import html
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest

from attention_conformance.conformance.harness import session
from attention_conformance.conformance.judging import agreement, records
from attention_conformance.conformance.judging.records import REPRO_HEADING, CaseRecord, parse_shapes, shapes_text
from attention_conformance.conformance.reporting import (
    counts,
    environment,
    html_report,
    json_report,
    summary,
    transport,
)
from attention_conformance.conformance.specdata import ROOT, clauses

pytestmark = pytest.mark.selfcheck

SCHEMA = json.loads((ROOT / "docs" / "report-schema.json").read_text())
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def run_with_report(tmp_path, impl: str, *args: str, name: str = "r.json"):
    environment = {**os.environ}
    for variable in ("PYTEST_XDIST_WORKER", "ATTENTION_CONFORMANCE_IMPL", "PYTEST_ADDOPTS"):
        environment.pop(variable, None)
    report = tmp_path / name
    command = [sys.executable, "-m", "pytest", "conformance", "-q", "-n", "0", "-p", "no:cacheprovider", "--impl", impl,
               "--hypothesis-profile", "dev", "--conformance-report", str(report), "-W", "ignore::DeprecationWarning",
               *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=110, env=environment)
    return done, report, html_report.html_path(report)


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
    assert counts["passed"] > 0 and counts["failed"] == 0
    assert counts["judged"] == counts["passed"] + counts["deviation"]
    assert counts["cases"] == counts["judged"] + counts["unsupported"] == len(report["cases"])
    passed = [c for c in report["cases"] if c["status"] == "passed"]
    assert passed and not any({"shapes", "message"} & set(c) for c in passed)  # compact records
    assert not any(value is None or value == "" for c in report["cases"] for value in c.values())
    assert "\n  " not in json_path.read_text()  # no indentation
    assert "cases per implementation" in done.stdout and "examples_my_attention" in done.stdout
    assert f"{counts['judged']} cases judged ({counts['passed']} passed" in done.stdout
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
    assert "<details>" not in page[page.index("<h2>Failures</h2>"):]


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """One correct and one broken implementation in one run (fixtures only): a page with passes and failures."""
    return run_with_report(tmp_path_factory.mktemp("mixed"), "examples.my_attention", "--impl",
                           "examples.wrong_axis_softmax", "-k", "test_fixture")


def test_a_failing_run_lists_the_failures_in_both_files(mixed_run):
    done, json_path, html_path = mixed_run
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(json_path.read_text())
    validate(report)
    assert report["exit_status"] == 1
    failed = [c for c in report["cases"] if c["status"] == "failed"]
    assert {c["implementation"] for c in failed} == {"examples_wrong_axis_softmax"}
    assert {c["clause"] for c in failed} & {"softmax.last-axis", "softmax.definition"}, failed[:3]
    assert all(c["message"].startswith(f"[{c['clause']}]") for c in failed)
    assert all(c["op"] == "softmax" and parse_shapes(c["shapes"]) for c in failed)
    assert report["summary"]["examples_wrong_axis_softmax"]["failed"] == len(failed)
    assert report["summary"]["examples_my_attention"]["failed"] == 0

    page = html_path.read_text(encoding="utf-8")
    assert "<h2>Failures</h2>" in page and 'class="failures"' in page
    section = page[page.index("<h2>Failures</h2>"):]
    section = section[:section.find("<h2>", 4) if "<h2>" in section[4:] else None]
    groups = {(c["implementation"], c["test"], c["clause"], c["op"], c["device"], c["dtype"]) for c in failed}
    rows = section[:section.index("</table>")].count("<tr>") - 1
    assert rows == len(groups) == section.count("<details>")  # one folded message and repro per group
    assert "<details open" not in page
    visible = re.sub(r"<details>.*?</details>", "", section, flags=re.S)
    assert REPRO_HEADING not in visible and "<pre" not in visible  # nothing long unfolded
    first = failed[0]
    assert f"<pre>{html.escape(first['message'].splitlines()[0])}" in section  # the full message, escaped, folded
    assert section.count(html.escape(REPRO_HEADING)) == len(groups)
    # What a row shows unfolded: case, problem, worst element and ratio (of the group's last record).
    last = [c for c in failed if (c["implementation"], c["test"], c["clause"], c["op"], c["device"], c["dtype"])
            == sorted(groups, key=lambda k: tuple(map(str, k)))[0]][-1]
    worst = next(line.split(None, 1)[1] for line in last["message"].splitlines() if line.strip().startswith("worst "))
    assert html.escape(last["case"]) in visible and html.escape(worst.strip()) in visible
    assert f"<td class=num>{html.escape(html_report.fmt(last['ratio']))}</td>" in visible


def test_the_plot_shows_each_case_ratio_failed_above_one_passed_at_or_below(mixed_run, monkeypatch):
    """One point per judged case at its worst ratio error/allowed (the JSON's ratio, the verdict's figure)."""
    done, json_path, html_path = mixed_run
    report = json.loads(json_path.read_text())
    judged = [c for c in report["cases"] if c["status"] in ("passed", "failed", "deviation")]
    points, infinite, without = html_report.plot_points(report["cases"])
    assert len(points) + without == len(judged) and infinite == 0
    by_status = defaultdict(list)
    for point in points:
        by_status[point["status"]].append(point["ratio"])
    assert by_status["failed"] and by_status["passed"]
    assert min(by_status["failed"]) > 1 >= max(by_status["passed"])
    assert {p["implementation"] for p in points if p["status"] == "failed"} == {"examples_wrong_axis_softmax"}
    assert {p["implementation"] for p in points if p["status"] == "passed"} >= {"examples_my_attention"}
    for case in judged:  # the ratio drawn is the record's, taken at one element by the verdict
        if "ratio" in case:
            assert (case["ratio"] > 1) == (case["status"] == "failed"), case
    page = html_path.read_text(encoding="utf-8")
    if HAS_MATPLOTLIB:
        assert '<img class="plot"' in page and "the line at 1 is the allowed error" in page
    # Without matplotlib the same figures are a table: failures counted above 1 for the broken one only.
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)
    table = html_report.render(report, html_path)
    table = table[table.index('<table class="ratios">'):]
    table = table[:table.index("</table>")]
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td>.*?<td class=num>([^<]*|<b[^>]*>\d+</b>)</td></tr>", table)
    above = {(impl, dtype): int(re.sub(r"<[^>]+>", "", n)) for impl, dtype, n in rows}
    assert above and all(n == 0 for (impl, _), n in above.items() if impl == "examples_my_attention")
    assert any(n > 0 for (impl, _), n in above.items() if impl == "examples_wrong_axis_softmax"), above


def test_the_page_escapes_text_and_survives_without_matplotlib(tmp_path, monkeypatch):
    """Every string from an implementation or a message is escaped; without matplotlib the page says so."""
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)  # makes the import fail
    evil = "<script>alert('x')</script>"
    report = {
        "schema_version": 3,
        "suite": {"name": "attention-conformance", "version": "0.1.0", "commit": None},
        "exit_status": 2,
        "complete": False,
        "incomplete_reason": f"interrupted by SIGTERM {evil}",
        "environment": {"versions": {"python": "3.11.7", "torch": None},
                        "devices": {"cpu": "x86_64", "cuda": [f"cuda:0 {evil}"], "jax": ["gpu:0 H100"]},
                        "platform": "Linux"},
        "implementations": [{
            "name": evil, "spec": "m", "array": "numpy", "dtypes": {"cpu": ["float32"], "cuda": []},
            "devices": ["cpu"], "operations": {"softmax": False, "sdpa": True, "multi_head_attention": False},
            "fully_masked_rows": {"bool": "uniform", "float": "nan"},
            "known_deviations": [{"clause": "sdpa.finite", "reason": evil}], "skip_reason": None,
        }],
        "summary": {evil: {"cases": 4, "judged": 3, "failed": 1, "passed": 1, "deviation": 1, "unsupported": 1,
                           "operations": {"sdpa": {"judged": 3, "passed": 1, "failed": 1, "deviation": 1,
                                                   "unsupported": 1}},
                           "unsupported_reasons": [{"reason": evil, "count": 1}]}},
        "cases": [
            {"test": "t", "implementation": evil, "clause": "sdpa.definition", "case": evil, "op": "sdpa",
             "dtype": "float32", "device": "cpu", "status": "failed", "max_abs_error": 1.0, "allowed": 0.0,
             "message": f"[sdpa.definition] {evil}", "shapes": f"q=1x1x2x3 {evil}=()"},
            {"test": "", "implementation": evil, "clause": "sdpa.definition", "case": "c", "dtype": "float32",
             "device": "cpu", "status": "passed", "max_abs_error": 0.0, "allowed": 1e-6, "ratio": 0.0},
            {"test": "", "implementation": evil, "clause": "mask.fully-masked-row", "case": "c", "op": "sdpa",
             "dtype": "float32", "device": "cpu", "status": "deviation", "message": evil},
            {"test": "", "implementation": evil, "clause": "sdpa.scale", "case": "c", "op": "sdpa",
             "dtype": "float16", "device": "cuda", "status": "unsupported", "message": evil, "shapes": "q=1x1x2x3"},
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
    assert f"q=1x1x2x3 {html.escape(evil)}=()" in page  # the failure's shapes string
    assert f"cuda:0 {html.escape(evil)}" in page and "gpu:0 H100" in page  # device lists
    assert f"1 × {html.escape(evil)}" in page  # top unsupported reasons
    assert f"interrupted by SIGTERM {html.escape(evil)}" in page and "judged per operation: sdpa 3" in page


def _record(status="passed", message="", **fields):
    base = dict(test="t[x]", implementation="impl", clause="sdpa.definition", case="c", op="sdpa", dtype="float32",
                device="cpu", status=status, message=message)
    return CaseRecord(**{**base, **fields})


def test_case_records_are_compact():
    passed = _record(max_abs_error=np.float64(2.5919638831084502e-11), allowed=1.5313043847864254e-08,
                     ratio=0.0016926509901360712, shapes={"q": [1, 2, 3, 4]})
    assert passed.as_dict() == {"test": "t[x]", "implementation": "impl", "clause": "sdpa.definition", "case": "c",
                                "op": "sdpa", "dtype": "float32", "device": "cpu", "status": "passed",
                                "max_abs_error": 2.59196e-11, "allowed": 1.5313e-08, "ratio": 0.00169265}
    failed = _record("failed", f"[sdpa.definition] bad\n  problem  x\n  {REPRO_HEADING}\n    code",
                     max_abs_error=1.0, allowed=0.0, ratio=float("inf"), shapes={"q": (1, 2, 3, 4), "s": ()})
    data = failed.as_dict()
    assert "ratio" not in data and data["allowed"] == 0.0 and data["op"] == "sdpa"
    assert data["shapes"] == "q=1x2x3x4 s=()" and parse_shapes(data["shapes"]) == {"q": (1, 2, 3, 4), "s": ()}
    assert data["message"].endswith("    code")
    short = failed.as_dict(repro=False)["message"]
    assert short.startswith("[sdpa.definition] bad\n  problem  x\n") and "code" not in short
    # A ratio is never rounded across 1, the threshold of the verdict.
    assert _record("failed", ratio=1.0000000001).as_dict()["ratio"] > 1
    assert _record(ratio=0.99999999999).as_dict()["ratio"] <= 1
    assert shapes_text({}) == "" and parse_shapes("") == {}


def test_only_the_last_failure_of_a_group_keeps_its_repro():
    message = f"[c] x\n  {REPRO_HEADING}\n    snippet"
    records = [_record("failed", message, case="a"), _record("failed", message, case="b"),
               _record("failed", message, case="c", dtype="float64"), _record()]
    cases = json_report._case_dicts(records)
    assert ["snippet" in c.get("message", "") for c in cases] == [False, True, True, False]


def _terminal_lines(monkeypatch) -> list[str]:
    monkeypatch.setattr(agreement, "_OUTPUTS", defaultdict(dict))
    lines = []
    reporter = SimpleNamespace(section=lambda title, **kw: lines.append(f"== {title}"), write_line=lines.append,
                               stats={})
    summary.terminal_summary(reporter, SimpleNamespace(getoption=lambda name, default=None: default, stash={}))
    return lines


def test_the_summary_counts_judged_and_unsupported_cases_with_their_reasons(kept_records, monkeypatch):
    long_reason = "needs H*Dk == E " + "and a great deal more " * 10
    records.RECORDS[:] = (
        [_record(implementation="kern", case=f"p{i}") for i in range(5)]
        + [_record("failed", "[c] broken", implementation="kern"), _record("deviation", "declared", implementation="kern")]
        + [_record("unsupported", f"outside kern's declared region: head dim Dk {d} is outside 8..256 step 8\nmore",
                   implementation="kern", case=f"u{i}") for i, d in enumerate((12, 12, 20, 4))]
        + [_record("unsupported", "kern raised NotImplementedError: no", implementation="kern", case=f"n{i}")
           for i in range(2)]
        + [_record("unsupported", long_reason, implementation="kern", case="long")]
        + [_record("unsupported", "something rare", implementation="kern", op="softmax")]
        + [_record(implementation="plain")]
    )
    entry = counts.implementation_summary()["kern"]
    assert entry == {
        "cases": 15, "judged": 7, "passed": 5, "failed": 1, "deviation": 1, "unsupported": 8,
        "operations": {"softmax": {"judged": 0, "passed": 0, "failed": 0, "deviation": 0, "unsupported": 1},
                       "sdpa": {"judged": 7, "passed": 5, "failed": 1, "deviation": 1, "unsupported": 7}},
        "unsupported_reasons": [
            {"reason": "outside kern's declared region: head dim Dk <n> is outside 8..256 step 8", "count": 4},
            {"reason": "kern raised NotImplementedError: no", "count": 2},
            {"reason": " ".join(long_reason.split()), "count": 1},
        ],
    }
    assert counts.implementation_summary()["plain"] == {
        "cases": 1, "judged": 1, "passed": 1, "failed": 0, "deviation": 0, "unsupported": 0,
        "operations": {"sdpa": {"judged": 1, "passed": 1, "failed": 0, "deviation": 0, "unsupported": 0}}}
    lines = _terminal_lines(monkeypatch)
    assert lines[0] == "== attention conformance" and "not pytest tests" in lines[1]
    kern = lines.index(next(line for line in lines if line.startswith("kern ")))
    assert lines[kern] == ("kern               7 cases judged (5 passed, 1 failed, 1 deviation) = softmax 0 + sdpa 7; "
                           "8 cases unsupported")
    reasons = lines[kern + 1]
    assert reasons.strip().startswith('unsupported: 4 "outside kern\'s declared region: head dim Dk <n>')
    assert '; 2 "kern raised NotImplementedError: no"; 1 "needs H*Dk == E and a great' in reasons
    assert reasons.endswith('..."; 1 for other reasons') and "\n" not in reasons
    assert lines[kern + 2] == "plain              1 cases judged (1 passed, 0 failed) = sdpa 1"


def test_a_replayed_example_is_one_case(kept_records, monkeypatch):
    """Hypothesis replays examples (a covering corner it draws again, the final failing example): the summary, the
    coverage rule and the report's cases count each (test, case, clause, status) once; the last record is kept."""
    from attention_conformance.conformance.reporting import coverage

    message = f"[c] x\n  {REPRO_HEADING}\n    snippet"
    records.RECORDS[:] = [_record(case="a"), _record(case="a"), _record(case="b", ratio=0.5),
                         _record("failed", "[c] first", case="f"), _record("failed", message, case="f"),
                         _record(case="a", test="t[y]"), _record("unsupported", "no", case="a"),
                         _record(case="b", ratio=0.25)]  # one case checked twice (each head alone, say)
    entry = counts.implementation_summary()["impl"]
    assert (entry["cases"], entry["judged"], entry["passed"], entry["failed"], entry["unsupported"]) == (5, 4, 3, 1, 1)
    cases = json_report._case_dicts(records.distinct(records.RECORDS))
    assert [(c["test"], c["case"], c["status"]) for c in cases] == [
        ("t[x]", "a", "passed"), ("t[x]", "b", "passed"), ("t[x]", "f", "failed"), ("t[y]", "a", "passed"),
        ("t[x]", "a", "unsupported")]
    assert "snippet" in cases[2]["message"]  # the last of the replays, with its repro
    assert cases[1]["ratio"] == 0.5  # the worst of the checks of one case
    judged, _ = coverage.judged_and_unsupported(records.RECORDS)
    assert judged[("impl", "sdpa")] == 4


def test_an_interrupted_run_says_so_first(kept_records, monkeypatch):
    records.RECORDS[:] = [_record()]
    monkeypatch.setitem(session.STATE, "reason", "interrupted by SIGTERM")
    lines = _terminal_lines(monkeypatch)
    assert lines[:2] == ["== attention conformance", "INCOMPLETE: interrupted by SIGTERM; the counts below are of the "
                         "cases judged before it (the report says complete: false)"]
    monkeypatch.setitem(session.STATE, "reason", None)
    assert not any("INCOMPLETE" in line for line in _terminal_lines(monkeypatch))


class _FakeConfig:
    def __init__(self):
        self.workeroutput = {}


def test_workers_send_records_versions_and_devices_to_the_controller(kept_records, monkeypatch):
    """send_to_controller on two fake workers, receive_from_worker on the controller: records, versions, devices."""
    execnet = pytest.importorskip("execnet")
    monkeypatch.setattr(environment, "WORKER_ENVIRONMENT", {"versions": {}, "devices": {}})
    monkeypatch.setattr(transport, "RECEIVED", set())
    monkeypatch.setattr(agreement, "_OUTPUTS", defaultdict(dict))
    sent = _record("failed", "[c] x", max_abs_error=np.float64(1.5), allowed=0.0, ratio=float("inf"),
                   shapes={"q": (1, 2, 3, 4)})
    records.RECORDS[:] = [sent]
    agreement.keep("c", "impl", "cpu", "float32", np.array([1.0, 2.0], dtype=np.float32))
    workers = []
    for torch_version, devices in (("2.13.0", {"cpu": "x86_64", "cuda": ["cuda:0 NVIDIA H100", "cuda:1 NVIDIA H100"]}),
                                   (None, {"cpu": "other", "cuda": ["cuda:0 NVIDIA H100"], "jax": ["gpu:0 NVIDIA H100"]})):
        monkeypatch.setattr(environment, "local_environment", lambda v=torch_version, d=devices: {
            "versions": {"python": "3.11", "numpy": "2.0", "torch": v, "jax": None}, "devices": d})
        config = _FakeConfig()
        transport.send_to_controller(config)
        workers.append(SimpleNamespace(workeroutput=execnet.loads(execnet.dumps(config.workeroutput)),
                                       workerinput={"workerid": f"gw{len(workers)}"}))
    # The real thing must be sendable too (execnet refuses a str subclass such as torch's version).
    monkeypatch.undo()
    execnet.dumps(environment.local_environment())
    monkeypatch.setattr(environment, "WORKER_ENVIRONMENT", {"versions": {}, "devices": {}})
    monkeypatch.setattr(transport, "RECEIVED", set())
    monkeypatch.setattr(agreement, "_OUTPUTS", defaultdict(dict))

    records.RECORDS[:] = []
    for node in reversed(workers):  # the worker without torch finishes first; xdist may report one down twice
        transport.receive_from_worker(node)
        transport.receive_from_worker(node)
    assert [rec.as_dict() for rec in records.RECORDS] == [sent.as_dict()] * 2
    assert records.RECORDS[0].ratio == float("inf") and records.RECORDS[0].shapes == {"q": [1, 2, 3, 4]}
    assert list(agreement._OUTPUTS) == [("float32", "c")]
    monkeypatch.setattr(environment, "local_environment", lambda: {
        "versions": {"python": "3.11", "numpy": "2.4", "torch": None, "jax": None, "hypothesis": "6"},
        "devices": {"cpu": "controller"}})
    env = environment.environment()
    assert env["versions"] == {"python": "3.11", "numpy": "2.4", "torch": "2.13.0", "jax": None, "hypothesis": "6"}
    assert env["devices"] == {"cpu": "controller", "cuda": ["cuda:0 NVIDIA H100", "cuda:1 NVIDIA H100"],
                              "jax": ["gpu:0 NVIDIA H100"]}


def test_a_worker_streams_its_records_and_the_controller_reads_those_it_never_received(kept_records, monkeypatch,
                                                                                       tmp_path):
    """After each item a worker appends what it judged to its stream; a worker that never delivered its
    workeroutput (interrupted, crashed) is read from it; one that did is not read twice."""
    monkeypatch.setattr(agreement, "_OUTPUTS", defaultdict(dict))
    monkeypatch.setattr(agreement, "KEPT", [])
    monkeypatch.setattr(environment, "WORKER_ENVIRONMENT", {"versions": {}, "devices": {}})
    monkeypatch.setattr(transport, "RECEIVED", {"gw1"})
    monkeypatch.setattr(transport, "_DIRECTORY", {"path": str(tmp_path)})
    first, second = _record(case="a"), _record("failed", "[c] x", case="b", ratio=float("inf"), shapes={"q": (1, 2)})
    for worker in ("gw0", "gw1"):
        monkeypatch.setattr(transport, "_WRITER", {"records": 0, "outputs": 0, "environment": None,
                                                   "failed": False})
        config = SimpleNamespace(workerinput={transport.STREAM_KEY: str(tmp_path), "workerid": worker})
        records.RECORDS[:] = [first]
        transport.stream(config)
        records.RECORDS.append(second)
        agreement.keep("c", "impl", "cpu", "float32", np.array([[1.0, -2.5e-8, np.nan]], dtype=np.float32))
        transport.stream(config)
        transport.stream(config)  # nothing new: nothing written
    with open(tmp_path / "gw0.jsonl", "a") as handle:
        handle.write('{"record": {"test": "cut sho')  # the worker died mid-line
    assert (tmp_path / "gw0.jsonl").read_text().count('"record"') == 3
    records.RECORDS[:] = []
    assert transport.read_unreceived() == {"gw0": 2}
    assert [rec.as_dict() for rec in records.RECORDS] == [first.as_dict(), second.as_dict()]
    assert records.RECORDS[1].ratio == float("inf") and list(agreement._OUTPUTS) == [("float32", "c")]
    np.testing.assert_array_equal(agreement._OUTPUTS[("float32", "c")]["impl@cpu"],
                                  np.array([[1.0, -2.5e-8, np.nan]], dtype=np.float32).astype(np.float64))
    assert environment.WORKER_ENVIRONMENT["versions"]["python"]
    assert transport.read_unreceived() == {}  # read once


def test_a_worker_whose_stream_is_whole_sends_its_count_and_the_controller_reads_the_stream(kept_records,
                                                                                          monkeypatch, tmp_path):
    """execnet's serialiser is slow: a worker sends how many records its stream holds, not the records, unless the
    stream stopped mirroring its records (a self-check put some back) or could not be written."""
    monkeypatch.setattr(agreement, "_OUTPUTS", defaultdict(dict))
    monkeypatch.setattr(agreement, "KEPT", [])
    monkeypatch.setattr(environment, "WORKER_ENVIRONMENT", {"versions": {}, "devices": {}})
    monkeypatch.setattr(transport, "RECEIVED", set())
    monkeypatch.setattr(transport, "_DIRECTORY", {"path": str(tmp_path)})
    first, second = _record(case="a"), _record("failed", "[c] x", case="b", ratio=float("inf"))
    nodes = []
    for worker, put_back in (("gw0", False), ("gw1", True)):
        monkeypatch.setattr(transport, "_WRITER", {"records": 0, "outputs": 0, "environment": None,
                                                   "failed": False})
        config = SimpleNamespace(workerinput={transport.STREAM_KEY: str(tmp_path), "workerid": worker},
                                 workeroutput={})
        records.RECORDS[:] = [first, second]
        transport.stream(config)
        if put_back:
            records.RECORDS[:] = [first]
        transport.stream(config, final=True)
        transport.send_to_controller(config)
        assert ("conformance_records" in config.workeroutput) == put_back
        assert config.workeroutput.get("conformance_streamed") == (None if put_back else 2)
        nodes.append(SimpleNamespace(workeroutput=config.workeroutput, workerinput=config.workerinput))
    records.RECORDS[:] = []
    for node in nodes:
        transport.receive_from_worker(node)
    assert [rec.as_dict() for rec in records.RECORDS] == [first.as_dict(), second.as_dict(), first.as_dict()]
    assert transport.read_unreceived() == {}
    (tmp_path / "gw0.jsonl").write_text("")  # a stream that does not hold what the worker counted is an error
    monkeypatch.setattr(transport, "RECEIVED", set())
    with pytest.raises(RuntimeError, match="streamed 2 case records"):
        transport.receive_from_worker(nodes[0])


def test_gzip_and_page_paths(tmp_path):
    assert html_report.html_path(Path("a/r.json.gz")) == Path("a/r.html") == html_report.html_path(Path("a/r.json"))
    report = {"schema_version": 3, "cases": [{"a": 1}, {"b": [1, 2]}], "agreement": []}
    text = json_report.dumps(report)
    assert json.loads(text) == report and text.count("\n") == 8


def test_a_report_under_xdist_has_the_workers_records(tmp_path):
    """Also: a path ending in .gz gets gzip, and the page beside it is r.html."""
    done, json_path, html_path = run_with_report(tmp_path, "examples.my_attention", "-k", "test_fixture", "-n", "1",
                                                 name="r.json.gz")
    assert done.returncode == 0, done.stdout[-3000:]
    report = json.loads(gzip.decompress(json_path.read_bytes()))
    validate(report)
    assert report["summary"].get("examples_my_attention", {}).get("passed", 0) > 0
    assert report["environment"]["versions"]["numpy"]  # imported by the worker that ran the cases
    page = html_path.read_text(encoding="utf-8")
    assert html_path.name == "r.html" and '<a href="r.json.gz">' in page


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed: the plot is a table then")
def test_the_plot_draws_a_ratio_past_twelve_decades_on_its_top_edge():
    """A float64 softmax element whose exact value underflowed to 0 is allowed the dtype's rounding near 0 (about
    4e-307): a wrong value there is a ratio near 1e306, which broke the log axis and lost the plot."""
    cases = [{"status": "failed", "implementation": "wrong", "dtype": "float64", "ratio": 1.4e306},
             {"status": "passed", "implementation": "right", "dtype": "float64", "ratio": 0.02}]
    page = html_report._plot(cases, ["wrong", "right"])
    assert '<img class="plot"' in page and "drawn on the top edge" in page

"""Conformance across runners and over time: --shard, `attention-conformance merge`, --baseline.

End to end on a small run (tests/twins.py's first release beside examples/my_attention.py: some fixtures
and four properties, float32 and float64, the derandomized `ci` profile, so every run draws the same examples):
the merge of its two shard reports (one shard under xdist) equals the merge of the run unsplit, and equals its
report; the run compared with itself prints "no change"; the second release (an sdpa that ignores an explicit scale, under the same NAME) compared
with the first names exactly the clauses it broke. The rest are unit checks of the plan, the coverage rule in
shards and the merge of environments.
"""
from __future__ import annotations

import builtins
import copy
import gzip
import json
import os
import random
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import jsonschema
import pytest

from attention_conformance.conformance.reporting import baseline, coverage, merge, merge_cli, merged_html, shards
from attention_conformance.conformance.specdata import ROOT

# Each end-to-end test starts pytest several times (about 4 s of CPU each): past the default 120 s under load.
pytestmark = [pytest.mark.selfcheck, pytest.mark.timeout(400)]

SCHEMA = json.loads((ROOT / "docs" / "report-schema.json").read_text())
SELECTION = ["conformance/test_fixtures.py", "conformance/test_properties.py", "--dtype", "float64",
             "--dtype", "float32", "-k", "explicit_scale or default_scale or softmax_matches or qkv or scaled"]
RELEASE_1, RELEASE_2 = "tests.twins:Release1", "tests.twins:Release2"
BESIDE = "examples.my_attention"  # a second implementation: the fixtures' cross-backend agreement must survive shards


def run_suite(tmp_path, name: str, impl: str, *args: str, workers: str = "0"):
    """The small run as a user runs it, writing tmp_path/NAME.json; (completed process, report)."""
    environment = {**os.environ}
    for variable in ("PYTEST_XDIST_WORKER", "ATTENTION_CONFORMANCE_IMPL", "PYTEST_ADDOPTS"):
        environment.pop(variable, None)
    path = tmp_path / f"{name}.json"
    command = [sys.executable, "-m", "pytest", *SELECTION, "-q", "-n", workers, "-p", "no:cacheprovider",
               "--impl", impl, "--impl", BESIDE, "--hypothesis-profile", "ci", "--conformance-report", str(path),
               "-W", "ignore::DeprecationWarning", *args]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240, env=environment)
    return done, (json.loads(path.read_text()) if path.exists() else None)


def validate(report: dict) -> None:
    errors = list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(report))
    assert not errors, [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in errors[:5]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The first release unsplit, then as shards 1/2 (one process) and 2/2 (two xdist workers)."""
    tmp_path = tmp_path_factory.mktemp("runners")
    whole = run_suite(tmp_path, "whole", RELEASE_1)
    first = run_suite(tmp_path, "shard1", RELEASE_1, "--shard", "1/2")
    second = run_suite(tmp_path, "shard2", RELEASE_1, "--shard=2/2", workers="2")
    for done, report in (whole, first, second):
        assert done.returncode == 0 and report is not None, done.stdout[-3000:] + done.stderr[-2000:]
    return SimpleNamespace(path=tmp_path, whole=whole[1], shards=[first[1], second[1]], shard_output=first[0].stdout)


# ------------------------------------------------------------------ shards, end to end
def test_merging_the_shards_equals_the_unsplit_run(runs):
    for report in (runs.whole, *runs.shards):
        validate(report)
    one, two = (report["shard"] for report in runs.shards)
    assert f"shard 1/2: {one['items']} of {one['of']} items" in runs.shard_output
    assert one["of"] == two["of"] == len(runs.whole["durations"]) and one["items"] + two["items"] == one["of"]
    assert one["plan"] == two["plan"] and one["items"] and two["items"]
    assert not set(runs.shards[0]["durations"]) & set(runs.shards[1]["durations"])  # no item ran twice
    together = merge.merge(["shard1.json", "shard2.json"], runs.shards)
    alone = merge.merge(["whole.json"], [runs.whole])
    validate(together)
    assert merge.verdicts(together) == merge.verdicts(alone)
    # ... and equals the unsplit run's own report: its summary, and its cases as a multiset.
    assert together["summary"]["E1"] == runs.whole["summary"]
    key = lambda case: json.dumps(case, sort_keys=True)  # noqa: E731
    assert Counter(map(key, together["cases"]["E1"])) == Counter(map(key, runs.whole["cases"]))
    assert together["coverage"] == [] and together["complete"] and merge.exit_status(together) == 0
    assert together["agreement"]["E1"] == runs.whole["agreement"] and runs.whole["agreement"]


def test_the_merge_command_writes_the_matrix_and_its_page(runs, tmp_path):
    out = tmp_path / "combined.json.gz"
    done = subprocess.run([sys.executable, "-m", "attention_conformance", "merge", str(runs.path / "shard1.json"),
                           str(runs.path / "shard2.json"), "-o", str(out), "--durations-out",
                           str(tmp_path / "durations.json")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "shards 1/2, 2/2" in done.stdout
    merged = json.loads(gzip.decompress(out.read_bytes()))
    validate(merged)
    page = (tmp_path / "combined.html").read_text()
    assert "Clauses × implementation × device × environment" in page and "sdpa.scale-explicit" in page
    measured, _ = shards.read_durations(tmp_path / "durations.json")
    assert set(measured) == set(runs.whole["durations"])


# ------------------------------------------------------------------ baselines, end to end
def test_a_run_compared_with_itself_is_no_change_and_a_broken_release_names_what_it_broke(runs):
    old = runs.path / "whole.json"
    done, report = run_suite(runs.path, "again", RELEASE_1, "--baseline", str(old))
    assert done.returncode == 0, done.stdout[-3000:]
    assert f"baseline {old} (suite" in done.stdout and ": no change" in done.stdout
    assert report["baseline"]["no_change"] and report["baseline"]["judged_only_now"] == 0
    validate(report)

    done, report = run_suite(runs.path, "release2", RELEASE_2, "--baseline", str(old))
    assert done.returncode == 1, done.stdout[-3000:]  # unchanged without --fail-on-regression
    validate(report)
    broken = {case["clause"] for case in report["cases"] if case["status"] == "failed"}
    assert "sdpa.scale-explicit" in broken
    assert any("test_fixture" in case["test"] for case in report["cases"] if case["status"] == "failed")
    newly = {row["clause"] for row in report["baseline"]["newly_broken"]}
    assert newly == broken and all(row["baseline"]["failed"] == 0 for row in report["baseline"]["newly_broken"])
    line = next(line for line in done.stdout.splitlines() if "NEWLY BROKEN" in line)
    assert line.split(": ", 1)[1].split(", ") == [f"{row['clause']} ({row['failed']} failed)"
                                                  for row in report["baseline"]["newly_broken"]]
    assert "twin_attention 1.0 -> 2.0" in done.stdout  # the implementation's version, carried by the report
    assert report["baseline"]["fixed"] == [] and report["baseline"]["deviations_added"] == []
    page = (runs.path / "release2.html").read_text()
    assert "Compared with the baseline" in page and "Newly broken (" in page
    # The merge command compares too; with --fail-on-regression the new breakage fails it.
    merged_args = [str(runs.path / "release2.json"), "--baseline", str(old)]
    assert merge_cli.main(merged_args) == 0 and merge_cli.main([*merged_args, "--fail-on-regression"]) == 1

    # --fail-on-regression: only new breakage fails; the same breakage again passes.
    done, report = run_suite(runs.path, "release2-again", RELEASE_2, "--baseline", str(runs.path / "release2.json"),
                             "--fail-on-regression")
    assert done.returncode == 0, done.stdout[-3000:]
    assert ": no change" in done.stdout and report["exit_status"] == 0


def test_a_report_from_before_op_and_spec_hash_is_still_a_baseline(runs):
    legacy = copy.deepcopy(runs.whole)
    legacy["suite"].pop("spec_hash")
    for case in legacy["cases"]:
        if case["status"] == "passed":
            case.pop("op")
    assert merge.merge(["old.json"], [legacy])["summary"]["E1"] == runs.whole["summary"]
    result = baseline.compare(runs.whole, legacy, "old.json")
    assert result["no_change"] and result["same_spec"] is None and result["judged_only_now"] == 0


def test_fail_on_regression_keeps_errors_and_needs_a_baseline(monkeypatch):
    from attention_conformance.conformance.judging.messages import ConformanceFailure

    config = SimpleNamespace(stash={}, getoption=lambda name, default=None: default)
    monkeypatch.setattr(baseline, "VERDICT_FAILURES", {"t[a]"})
    monkeypatch.setattr(baseline, "OTHER_FAILURES", set())
    same = {"newly_broken": []}
    assert baseline.regression_status(1, same, config) == 0
    assert baseline.regression_status(1, {"newly_broken": [{}]}, config) == 1
    assert baseline.regression_status(0, {"newly_broken": [{}]}, config) == 1
    assert baseline.regression_status(2, same, config) == 2  # an interrupted run stays interrupted
    monkeypatch.setattr(baseline, "OTHER_FAILURES", {"t[b]"})  # an error, a crash, a time limit: never tolerated
    assert baseline.regression_status(1, same, config) == 1
    # A verdict, or a group of verdicts (Hypothesis's distinct failures), and nothing else, is a verdict.
    group = getattr(builtins, "ExceptionGroup", None) or pytest.importorskip("exceptiongroup").ExceptionGroup
    verdict = ConformanceFailure("sdpa.definition", "wrong")
    assert baseline.is_verdict(verdict) and baseline.is_verdict(group("two", [verdict, verdict]))
    assert not baseline.is_verdict(group("mixed", [verdict, ValueError()]))
    assert not baseline.is_verdict(AssertionError("a self-check's own assert"))
    with pytest.raises(pytest.UsageError, match="--fail-on-regression needs --baseline"):
        baseline.load(SimpleNamespace(getoption=lambda name, default=None: name == "fail_on_regression" or default))


# ------------------------------------------------------------------ merge: environments apart
def _on_a_gpu(report: dict) -> dict:
    """The report as a CUDA runner of another torch would have written it (the cases on cuda)."""
    gpu = copy.deepcopy(report)
    gpu["environment"]["installed"]["torch"] = "2.13.0+cu128"
    gpu["environment"]["devices"]["cuda"] = ["cuda:0 NVIDIA H100 80GB HBM3"]
    for case in gpu["cases"]:
        case["device"] = "cuda"
    next(case for case in gpu["cases"] if case["implementation"] == "twin_attention")["status"] = "failed"
    return gpu


def test_a_cpu_and_a_cuda_report_are_one_matrix_with_both_devices_never_summed(runs):
    gpu = _on_a_gpu(runs.whole)
    merged = merge.merge(["cpu.json", "gpu.json"], [runs.whole, gpu])
    validate(merged)
    assert len(merged["environments"]) == 2
    gpu_env = next(env_id for env_id, env in merged["environments"].items()
                   if env["key"]["accelerators"] == ["NVIDIA H100 80GB HBM3"])
    assert "torch 2.13.0+cu128" in merged["environments"][gpu_env]["description"]
    devices = {(cell["environment"], cell["device"]) for cell in merged["matrix"]}
    assert len(devices) == 2 and (gpu_env, "cuda") in devices
    failing = [cell for cell in merged["matrix"] if cell["failed"]]
    assert len(failing) == 1 and failing[0]["environment"] == gpu_env and failing[0]["failures"] == [
        next(i for i, case in enumerate(merged["cases"][gpu_env]) if case["status"] == "failed")]
    for env_id, entries in merged["summary"].items():  # each environment counts its own run's cases only
        assert entries == runs.whole["summary"] or entries["twin_attention"]["failed"] == 1
    page = merged_html.render(merged)
    assert f'href="#{merged_html.anchor(failing[0])}"' in page and f'id="{merged_html.anchor(failing[0])}"' in page
    # The same CPU report twice is one environment whose cases count once.
    twice = merge.merge(["a.json", "b.json"], [runs.whole, runs.whole])
    assert len(twice["environments"]) == 1 and twice["summary"]["E1"] == runs.whole["summary"]
    # A label keeps two otherwise identical runners apart.
    labelled = copy.deepcopy(runs.whole)
    labelled["environment"]["label"] = "other-runner"
    assert len(merge.merge(["a.json", "b.json"], [runs.whole, labelled])["environments"]) == 2


H200_REPORT = ROOT / "docs" / "gpu-runs" / "2026-11-27-h200" / "run2-report.json.gz"


def test_a_real_cuda_report_merges_with_a_cpu_one(runs):
    """The report of the suite's run on an H200 (16 workers, stopped by SIGTERM at 98 % of its items, before the mends
    that followed it: docs/gpu-runs/2026-11-27-h200) beside this CPU run: two environments, each device its own cells,
    the GPU's failures in its cells only, and the merge incomplete as the GPU run was."""
    gpu = json.loads(gzip.decompress(H200_REPORT.read_bytes()))
    validate(gpu)
    merged = merge.merge(["cpu.json", "h200.json"], [runs.whole, gpu])
    validate(merged)
    h200 = next(env_id for env_id, env in merged["environments"].items()
                if env["key"]["accelerators"] == ["NVIDIA H200"])
    assert len(merged["environments"]) == 2 and "torch 2.11.0" in merged["environments"][h200]["description"]
    failing = {(cell["environment"], cell["implementation"], cell["device"])
               for cell in merged["matrix"] if cell["failed"]}
    assert failing == {(h200, name, "cuda")
                       for name in ("jax_dpa", "jax_pallas_flash", "torch_flex", "torch_sdpa_cudnn")}
    assert {cell["device"] for cell in merged["matrix"] if cell["environment"] == h200} == {"cuda"}
    # Interrupted: not held to the coverage rule, so the merge, the coverage gate, cannot pass it (it exited 0 before).
    assert not merged["complete"] and merge.exit_status(merged) == 2


def test_merge_refuses_what_cannot_be_one_run(runs, tmp_path):
    one, two = runs.shards
    alone = merge.merge(["s1"], [one])
    validate(alone)
    assert merge.missing_shards(alone) == ["E1 2/2"] and merge.exit_status(alone) == 1 and not alone["complete"]
    with pytest.raises(merge.MergeError, match="are both shard 1/2"):
        merge.merge(["a", "b"], [one, one])
    other_plan = copy.deepcopy(two)
    other_plan["shard"]["plan"] = "0" * 16
    with pytest.raises(merge.MergeError, match="different plans"):
        merge.merge(["s1", "s2"], [one, other_plan])
    (tmp_path / "notes.json").write_text('{"hello": 1}')
    done = subprocess.run([sys.executable, "-m", "attention_conformance", "merge", str(tmp_path / "notes.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{tmp_path / 'notes.json'}: not an attention-conformance report" in done.stderr


# ------------------------------------------------------------------ the coverage rule in shards
def test_a_shard_that_judged_nothing_of_an_implementation_is_left_to_the_merge(runs, monkeypatch):
    # In the shard: rule 2 only (it needs the whole selection, which every shard sees); rules 1 and 3 wait.
    monkeypatch.setattr(coverage, "WHOLE_RUN", {"runnable": {("x", "sdpa")}, "collected": 3, "sharded": True})
    monkeypatch.setattr(coverage, "RUNNABLE", set())
    monkeypatch.setattr(coverage, "RECORDS", [])
    config = SimpleNamespace(getoption=lambda name, default=None: 1 if name == "min_judged" else default)
    impls = [SimpleNamespace(name="x"), SimpleNamespace(name="named_but_unrunnable")]
    lines = coverage.problems(config, impls, {"named_but_unrunnable"}, lambda impl: "no GPU here")
    assert lines == ["named_but_unrunnable: no case could run in this run: no GPU here"]
    # At the merge: the shards' cases together. Shard 1 judged no case of softmax, shard 2 did: no line.
    one, two = (copy.deepcopy(report) for report in runs.shards)
    one["cases"] = [case for case in one["cases"] if case["op"] != "softmax"]
    assert any(case["op"] == "softmax" for case in two["cases"])
    assert merge.merge(["s1", "s2"], [one, two])["coverage"] == []
    # Neither judged one: the merge applies the floor and fails.
    two["cases"] = [case for case in two["cases"] if case["op"] != "softmax"]
    merged = merge.merge(["s1", "s2"], [one, two])
    assert [entry["line"] for entry in merged["coverage"]] == [
        "twin_attention: 0 softmax case(s) judged, fewer than --min-judged 1"]
    assert merged["coverage"][0]["applied_by"] == "merge" and merge.exit_status(merged) == 1


# ------------------------------------------------------------------ the plan
def _item(nodeid: str, fixture: str | None = None, skipped: bool = False):
    params = {"fixture_case": SimpleNamespace(id=fixture)} if fixture else {}
    return SimpleNamespace(nodeid=nodeid, callspec=SimpleNamespace(params=params),
                           get_closest_marker=lambda name: object() if name == "skip" and skipped else None)


def test_the_plan_is_balanced_deterministic_and_keeps_fixture_cases_together():
    items = [_item(f"conformance/test_p.py::test_{n % 7}[impl-cpu-float{32 + n}]") for n in range(40)]
    items += [_item(f"conformance/test_fixtures.py::test_fixture[fx{n}-{impl}-cpu-float32]", fixture=f"fx{n}")
              for n in range(5) for impl in ("a", "b", "c")]
    items.append(_item("conformance/test_p.py::test_skipped[x]", skipped=True))
    durations = {item.nodeid: 0.5 + (i % 9) for i, item in enumerate(items[:30])}
    weights = shards.Weights(durations)
    plan, expected = shards.split(items, 3, weights)
    for _ in range(5):  # stable under any collection order
        shuffled = items[:]
        random.Random(_).shuffle(shuffled)
        assert shards.split(shuffled, 3, weights) == (plan, expected)
    assert max(expected) - min(expected) <= max(durations.values())  # the LPT bound: within the heaviest group
    for n in range(5):  # one fixture case's implementations share a shard (the agreement compares them)
        assert len({plan[shards.group_key(item)] for item in items if f"[fx{n}-" in item.nodeid}) == 1
    # Unmeasured items weigh their test function's median, else the median of all; skipped ones almost nothing.
    assert weights.of("conformance/test_p.py::test_3[new-impl]") == weights.by_function["conformance/test_p.py::test_3"]
    assert weights.of("conformance/test_q.py::test_new[x]") == weights.default
    assert weights.of("conformance/test_p.py::test_skipped[x]", skipped=True) == shards.SKIPPED_WEIGHT


def test_shard_options_are_checked(tmp_path):
    for bad in ("0/2", "3/2", "2", "a/b"):
        with pytest.raises(pytest.UsageError, match="--shard"):
            shards.parse(bad)
    assert shards.parse(" 2 / 4 ") == shards.Shard(2, 4)
    assert shards.read_durations(tmp_path / "absent.json")[0] == {}
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(pytest.UsageError, match="bad.json: not a durations file"):
        shards.read_durations(tmp_path / "bad.json")
    committed, source = shards.read_durations(None)
    assert committed and "durations.json" in source


def test_a_shard_needs_a_report_and_a_shard_without_items_passes(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTEST_XDIST_WORKER", "PYTEST_ADDOPTS")}
    base = [sys.executable, "-m", "pytest", "conformance/test_fixtures.py", "-q", "-n", "0", "-p", "no:cacheprovider",
            "--impl", RELEASE_1, "-k", "qkv-output and float64"]
    done = subprocess.run(base + ["--shard", "1/2"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=environment)
    assert done.returncode == 4 and "--shard needs --conformance-report" in done.stderr
    report = tmp_path / "empty.json"
    done = subprocess.run(base + ["--shard", "7/8", "--conformance-report", str(report)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=environment)
    assert done.returncode == 0, done.stdout[-2000:]
    data = json.loads(report.read_text())
    assert data["shard"]["items"] == 0 and data["shard"]["of"] >= 1 and data["coverage"] == []

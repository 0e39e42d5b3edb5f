"""A terminal a person reads: short failure blocks, and every failure's repro saved and replayed.

* The plain torch sdpa wrapper (examples/torch_sdpa_wrapper.py) prints a few lines per failing test, no block over
  BLOCK_LINES, and its summary names its two causes in two lines.
* A broken zoo member's failure, found by a run under xdist (workers save, the controller prints), is reproduced by
  `attention-conformance repro` from a fresh process (exit 1, the same clause); the same repro passes (exit 0) once
  the module is fixed, or on a correct implementation; `--print-python` writes a script that shows the error.
* The repro file holds what each kind of test needs: sdpa, softmax, multi-head attention, gradients, variant keywords,
  a relation between two calls (the property's own body is replayed), and a case judged without a test's arguments.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.harness import replay
from attention_conformance.conformance.judging import evidence, verdict
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.implementations.registry import load_implementation

from .test_cli import ROOT, pytest_run

pytestmark = [pytest.mark.selfcheck, pytest.mark.usefixtures("kept_records")]

BLOCK_LINES = 30  # the most lines one failure's block may take
HEADER_AND_SUMMARY_LINES = 45  # pytest's header and progress lines, the conformance summary, pytest's last line
LINES_PER_FAILED_TEST = 6  # on average: pytest's separator line, the block (3 lines when the case's text is short)
REPRO_LINE = re.compile(r"repro: (attention-conformance repro (\S+))")


def failure_blocks(out: str) -> list[list[str]]:
    """The lines of each failure in pytest's FAILURES section, its separator line first."""
    section = out.split(" FAILURES ", 1)[1].split("\n=", 1)[0].splitlines()[1:]
    blocks: list[list[str]] = []
    for line in section:
        if re.match(r"^_+ \S.* _+$", line):
            blocks.append([])
        if blocks:
            blocks[-1].append(line)
    return blocks


def repro_command(path: str, *args: str, env=None, cwd=ROOT) -> subprocess.CompletedProcess:
    """`attention-conformance repro ...` in a fresh interpreter (python -m: the console script may not be installed)."""
    environment = {**os.environ, **(env or {})}
    environment.pop("PYTEST_CURRENT_TEST", None)
    return subprocess.run([sys.executable, "-m", "attention_conformance", "repro", path, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=environment)


# ------------------------------------------------------------------ the terminal's line budget
def test_the_torch_sdpa_wrapper_prints_short_blocks_and_names_its_two_causes(tmp_path):
    pytest.importorskip("torch")
    done = pytest_run("--impl", "examples.torch_sdpa_wrapper", "--conformance-report", str(tmp_path / "run.json"))
    out = done.stdout
    assert done.returncode == 1, out[-3000:]
    failed = int(re.search(r"(\d+) failed", out.splitlines()[-1]).group(1))
    blocks = failure_blocks(out)
    assert len(blocks) == failed and failed > 0
    assert max(len(block) for block in blocks) <= BLOCK_LINES, max(blocks, key=len)
    total = len(out.splitlines())
    assert total <= HEADER_AND_SUMMARY_LINES + LINES_PER_FAILED_TEST * failed, (total, failed)
    for block in blocks:  # the clause and case, the problem, one repro command; no array
        assert block[1].startswith("E   [") and REPRO_LINE.search(block[-1]), block
        assert "np.array" not in "\n".join(block) and "too large to print" not in "\n".join(block)
    causes = [line for line in out.splitlines() if " cause: " in line]
    assert len(causes) == 2, causes
    # torch 2.13 (CPU) refuses a mask with is_causal where Dv != Dk: a run that drew no boolean such case reads
    # "whenever is_causal and a float mask", one that did "whenever mask and is_causal are both given and Dv != Dk"
    # (before the Dv factor that run named no condition).
    assert "Explicit attn_mask should not be set when is_causal=True" in causes[0] and " whenever " in causes[0]
    assert "is_causal and scale < 0" in causes[1]
    # Every block's repro was saved beside the report, and the report names it.
    report = json.loads((tmp_path / "run.json").read_text())
    jsonschema.validate(report, json.loads((ROOT / "docs" / "report-schema.json").read_text()))
    saved = {case["repro"] for case in report["cases"] if case.get("repro")}
    printed = {Path(REPRO_LINE.search(block[-1]).group(2)).stem for block in blocks}
    assert printed == saved and report["repro_directory"] == "run-repro"
    assert all((tmp_path / "run-repro" / f"{name}.npz").is_file() for name in printed)


# ------------------------------------------------------------------ a repro from a fresh process
BROKEN = (ROOT / "zoo" / "broken_scale_ignored.py").read_text()
FIXED = BROKEN.replace("    scale = ref.default_scale(q64.shape[-1])  # BUG: explicit scale discarded\n",
                       "    scale = ref.default_scale(q64.shape[-1]) if scale is None else scale\n")


def test_a_broken_members_repro_reproduces_it_and_passes_once_fixed(tmp_path):
    """Run under xdist (-n 2): a worker saves the repro, the controller prints its command."""
    assert FIXED != BROKEN
    module = tmp_path / "mykernel.py"
    module.write_text(BROKEN)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = pytest_run("conformance/test_properties.py", "--impl", "mykernel", "-k", "test_explicit_scale",
                      "--dtype", "float64", "-n", "2", "--conformance-report", str(tmp_path / "out" / "run.json"),
                      env=env)
    assert done.returncode == 1 and "[sdpa.scale-explicit]" in done.stdout, done.stdout[-3000:]
    command = REPRO_LINE.search(done.stdout).group(2)
    assert command.endswith(".npz") and "run-repro" in command  # beside the report, so named by its path
    report = json.loads((tmp_path / "out" / "run.json").read_text())  # the worker's record reached the controller
    assert Path(command).stem in {case.get("repro") for case in report["cases"] if case["status"] == "failed"}

    again = repro_command(command, env=env)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "FAILED [sdpa.scale-explicit]" in again.stdout and "exceeds the allowed error" in again.stdout

    script = repro_command(command, "--print-python", env=env)
    assert script.returncode == 0, script.stderr
    shown = subprocess.run([sys.executable, "-c", script.stdout], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env={**os.environ, **env})
    assert float(re.search(r"max abs error (\S+)", shown.stdout).group(1)) > 1e-3, shown.stdout + shown.stderr

    module.write_text(FIXED)  # the user fixes the module and replays the same ID
    fixed = repro_command(command, env=env)
    assert fixed.returncode == 0 and "PASSED" in fixed.stdout, fixed.stdout + fixed.stderr
    module.write_text(BROKEN)
    other = repro_command(command, "--impl", "builtin:numpy_native", env=env)
    assert other.returncode == 0 and "PASSED" in other.stdout, other.stdout + other.stderr


# ------------------------------------------------------------------ what a repro file holds, per kind of test
def _inner(test: str):
    return replay._inner_test(f"attention_conformance.conformance.{test}")


def saved_failure(tmp_path, test: str, impl: str, dtype: str = "float64", **arguments) -> tuple[Path, str]:
    """Call the property ``test`` (module:function) as Hypothesis would, on ``arguments``; save its failure's repro
    as properties.py and the plugin do. Returns (the file, the clause)."""
    inner = _inner(test)
    kwargs = {"impl": load_implementation(impl), "device": "cpu", "dtype": dtype, **arguments}
    with pytest.raises(ConformanceFailure) as raised:
        inner(**kwargs)
    evidence.remember_call(raised.value, inner, kwargs)
    return evidence.save(raised.value.evidence, tmp_path), raised.value.clause


def replayed(path: Path, impl: str | None = None) -> tuple[int, str]:
    lines: list[str] = []
    status = replay.replay_and_report(replay.load(path), impl, lines.append)
    return status, "\n".join(lines)


def sdpa_case(clauses, seed=7, lq=3, lk=5, **options) -> Case:
    rng = np.random.default_rng(seed)
    inputs = {"q": rng.standard_normal((1, 2, lq, 4)), "k": rng.standard_normal((1, 1, lk, 4)),
              "v": rng.standard_normal((1, 1, lk, 2)), **options}
    return Case("sdpa", inputs, tuple(clauses), f"hand-made sdpa case seed={seed}")


def mha_case(clauses) -> Case:
    rng = np.random.default_rng(1)
    params = {name: rng.standard_normal((4, 4)) for name in ("w_q", "w_k", "w_v", "w_o")}
    params["b_o"] = rng.standard_normal(4)
    inputs = {"query": rng.standard_normal((1, 3, 4)), "key": rng.standard_normal((1, 5, 4)),
              "value": rng.standard_normal((1, 5, 4)), "params": params, "num_heads": 2}
    return Case("multi_head_attention", inputs, tuple(clauses), "hand-made mha case")


KINDS = {
    "sdpa": ("test_properties:test_explicit_scale", "zoo.broken_scale_ignored", "builtin:numpy_native",
             lambda: {"case": sdpa_case(("sdpa.scale-explicit",), scale=0.3)}),
    "softmax": ("test_properties:test_softmax_matches_oracle", "zoo.broken_softmax_no_max_sub", "builtin:numpy_native",
                lambda: {"case": Case("softmax", {"x": np.array([[800.0, 0.0, -3.0], [1.0, 2.0, 3.0]]), "axis": -1},
                                      ("softmax.large-inputs",), "one row above exp's range")}),
    "multi_head_attention": ("test_mha:test_mha_matches_oracle", "zoo.broken_mha_no_scale", "builtin:numpy_native",
                             lambda: {"case": mha_case(("mha.projections", "mha.output-projection"))}),
    # A window (a tuple with None) and query_offset: every keyword the case passes comes back as it was.
    "variant keywords": ("test_variants:test_window", "zoo.broken_variant_window_exclusive_right",
                         "zoo.correct_variants_reference",
                         lambda: {"case": sdpa_case(("sdpa.window",), lq=4, lk=6, window=(1, 1), query_offset=2)}),
    # A relation between two calls: the shifted call alone is off, the first case passes against the oracle.
    "relation": ("test_properties:test_shift_invariance", "zoo.broken_mask_after_softmax", "builtin:numpy_native",
                 lambda: {"case": sdpa_case(("softmax.shift-invariance",)), "shift": -7.0}),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_saved_failure_replays_to_the_same_verdict_and_passes_on_a_correct_implementation(tmp_path, kind):
    test, broken, correct, arguments = KINDS[kind]
    path, clause = saved_failure(tmp_path, test, broken, **arguments())
    status, out = replayed(path)
    assert status == 1 and f"FAILED [{clause}]" in out and "the run filed it" not in out, out
    status, out = replayed(path, correct)
    assert status == 0 and out.splitlines()[-1].startswith("PASSED"), out


def test_a_relation_is_replayed_through_the_propertys_own_body(tmp_path):
    """The failed case alone agrees with the oracle (the shifted call is the one off): only calling the property
    again with its saved arguments (the case and the shift) reproduces the verdict."""
    path, clause = saved_failure(tmp_path, *KINDS["relation"][:2], **KINDS["relation"][3]())
    saved = replay.load(path)
    assert clause == "softmax.shift-invariance" and saved.kwargs["shift"] == -7.0
    verdict.Judge(load_implementation(KINDS["relation"][1]), "float64", "cpu").check(saved.case)  # passes alone
    assert replayed(path)[0] == 1


def test_a_replay_rebuilds_every_keyword_and_array_as_it_was(tmp_path):
    arguments = KINDS["variant keywords"][3]()
    path, _ = saved_failure(tmp_path, *KINDS["variant keywords"][:2], **arguments)
    saved = replay.load(path)
    case, original = saved.kwargs["case"], arguments["case"]
    assert case.label == original.label and case.clauses == original.clauses
    assert case.inputs["window"] == (1, 1) and isinstance(case.inputs["window"], tuple)
    assert case.inputs["query_offset"] == 2
    assert all(np.array_equal(case.inputs[name], original.inputs[name]) for name in ("q", "k", "v"))
    assert saved.meta["call"]["test"] == "attention_conformance.conformance.test_variants:test_window"


class ScaleIgnoredInEveryDtype:
    """zoo.broken_scale_ignored, declared in the 16-bit dtypes too."""

    DTYPES = ("float16", "bfloat16", "float32", "float64")

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        from zoo import broken_scale_ignored

        return broken_scale_ignored.sdpa(q, k, v, mask, is_causal, scale)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_case_replays_the_inputs_the_run_rounded(tmp_path, dtype):
    path, clause = saved_failure(tmp_path, KINDS["sdpa"][0], "tests.test_repro:ScaleIgnoredInEveryDtype", dtype=dtype,
                                 **KINDS["sdpa"][3]())
    saved = replay.load(path)
    assert str(saved.case.rounded(dtype)["q"].dtype) == dtype and saved.meta["dtype"] == dtype
    status, out = replayed(path)
    assert status == 1 and f"FAILED [{clause}]" in out and f"cpu/{dtype}" in out, out


def test_gradients_replay(tmp_path):
    pytest.importorskip("torch")
    case = sdpa_case(("grad.sdpa-q",))
    case.inputs["d_out"] = np.random.default_rng(2).standard_normal((1, 2, 3, 2))
    path, clause = saved_failure(tmp_path, "test_gradients:test_sdpa_gradients", "tests.nan_standins:TorchNaNGradient",
                                 case=case)
    assert clause == "grad.sdpa-q"
    status, out = replayed(path)
    assert status == 1 and "FAILED [grad.sdpa-q]" in out and "dq" in out, out
    status, out = replayed(path, "zoo.correct_torch")
    assert status == 0, out


def test_a_case_judged_without_a_tests_arguments_replays_through_its_judge(tmp_path):
    """A fixture, a large shape or a case drawn with st.data(): no call to replay, the judge's verdict instead."""
    judge = verdict.Judge(load_implementation("zoo.broken_scale_ignored"), "float32", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(sdpa_case(("sdpa.scale-explicit",), scale=2.0))
    path = evidence.save(raised.value.evidence, tmp_path)
    assert replay.load(path).kwargs is None
    status, out = replayed(path)
    assert status == 1 and "FAILED [sdpa.scale-explicit]" in out, out


def test_a_large_case_is_saved_whole(tmp_path):
    """64 x 32 elements and more once printed "inputs too large to print"; now every failure has its file."""
    path, _ = saved_failure(tmp_path, *KINDS["sdpa"][:2], case=sdpa_case(("sdpa.scale-explicit",), lq=96, lk=640,
                                                                         scale=0.3))
    saved = replay.load(path)
    assert saved.case.inputs["k"].shape == (1, 1, 640, 4) and replayed(path)[0] == 1
    script = replay.python_script(saved)
    assert "np.array(" not in script and str(path.resolve()) in script  # read from the file, not printed
    shown = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert float(re.search(r"max abs error (\S+)", shown.stdout).group(1)) > 1e-3, shown.stdout + shown.stderr


def test_ids_are_short_stable_and_distinct():
    first = evidence.repro_id("t[a]", "mod", "cpu", "float32", "sdpa.definition", "case 1")
    assert first == evidence.repro_id("t[a]", "mod", "cpu", "float32", "sdpa.definition", "case 1")
    assert evidence.ID_PATTERN.match(first)
    others = {evidence.repro_id("t[b]", "mod", "cpu", "float32", "sdpa.definition", "case 1"),
              evidence.repro_id("t[a]", "mod", "cpu", "float64", "sdpa.definition", "case 1"),
              evidence.repro_id("t[a]", "mod", "cpu", "float32", "sdpa.definition", "case 2")}
    assert first not in others and len(others) == 3


def test_a_bare_id_is_found_in_pytests_cache_here_or_above(tmp_path):
    cache = evidence.default_directories(tmp_path)[0]
    cache.mkdir(parents=True)
    (cache / "0123456789.npz").write_bytes(b"")
    (tmp_path / "sub").mkdir()
    assert evidence.find("0123456789", tmp_path / "sub") == cache / "0123456789.npz"
    with pytest.raises(evidence.ReproError, match="no repro abcdefabcd"):
        evidence.find("abcdefabcd", tmp_path)
    with pytest.raises(evidence.ReproError, match="neither a repro ID"):
        evidence.find("not-an-id", tmp_path)
    missing = repro_command("abcdefabcd", cwd=tmp_path)
    assert missing.returncode == 2 and "no repro abcdefabcd" in missing.stderr


# ------------------------------------------------------------------ the block itself
def test_several_verdicts_of_one_test_each_get_a_block_and_a_file(tmp_path, monkeypatch):
    """Hypothesis's group of distinct failures, and a failure whose shrinking ran out of time."""
    from types import SimpleNamespace

    from attention_conformance.conformance.harness.properties import ShrinkingStopped
    from attention_conformance.conformance.reporting import failure_block

    monkeypatch.setitem(evidence._STATE, "directory", tmp_path)
    failures = []
    for spec, clauses, options in (("zoo.broken_scale_ignored", ("sdpa.scale-explicit",), {"scale": 2.0}),
                                   ("zoo.broken_sdpa_no_scale", ("sdpa.scale-default",), {})):
        with pytest.raises(ConformanceFailure) as raised:
            verdict.Judge(load_implementation(spec), "float64", "cpu").check(sdpa_case(clauses, **options))
        failures.append(raised.value)
    item = SimpleNamespace(config=SimpleNamespace(option=SimpleNamespace(tbstyle="auto")),
                           location=("conformance/test_properties.py", 41, "test_x"))
    for error, count in ((failure_block._GROUP("Hypothesis found 2 distinct failures.", failures), 2),
                         (ShrinkingStopped(failures[0], 16.0), 1)):
        if isinstance(error, ShrinkingStopped):
            error.__cause__ = failures[0]
        report = SimpleNamespace(failed=True, longrepr="pytest's traceback")
        failure_block.after_test(item, SimpleNamespace(excinfo=SimpleNamespace(value=error)), report)
        text = str(report.longrepr)
        assert text.count("E     repro: attention-conformance repro ") == count, text
        assert all(f"[{failure.clause}]" in text for failure in failures[:count])
        assert len(text.splitlines()) <= BLOCK_LINES * count
        assert report.longrepr.reprcrash.message.startswith(f"[{failures[0].clause}] ")  # the short summary's line
    assert ("Hypothesis shrank this failure" in text and
            sorted(p.stem for p in tmp_path.glob("*.npz")) == sorted(f.evidence.id for f in failures))
    assert all(failure.record.repro_id == failure.evidence.id for failure in failures)
    # --tb=long and other styles keep pytest's traceback; an error of the suite itself keeps it too
    for tbstyle, error in (("long", failures[0]), ("auto", KeyError("a bug of the suite"))):
        report = SimpleNamespace(failed=True, longrepr="pytest's traceback")
        item.config.option.tbstyle = tbstyle
        failure_block.after_test(item, SimpleNamespace(excinfo=SimpleNamespace(value=error)), report)
        assert report.longrepr == "pytest's traceback"

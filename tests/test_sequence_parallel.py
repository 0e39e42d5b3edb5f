"""The sequence-parallel part of the suite checks itself: the SEQUENCE_PARALLEL declaration and the layouts, every
broken zoo member (zoo/sequence_parallel_broken_*) rejected under its clause and the correct ones passing, a hung
rank and a hung collective contained with no process left running, and the rank pool and the JAX child started
once per process however many cases, tests and implementations use them.
"""
from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings

import zoo
from attention_conformance.conformance import test_sequence_parallel
from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.harness import process_groups
from attention_conformance.conformance.harness.sequence_parallel import HUNG, SequenceParallelJudge, applicability
from attention_conformance.conformance.judging.containment import HungEarlier
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.specdata import ROOT, clauses
from attention_conformance.implementations.registry import from_object, load_implementation
from attention_conformance.implementations.sequence_parallel import (
    DeclarationError,
    declaration_of,
    gather,
    parse_declaration,
    shard,
    shard_positions,
)

pytestmark = pytest.mark.selfcheck


PROPERTIES = [fn for name, fn in vars(test_sequence_parallel).items()
              if name.startswith("test_") and hasattr(fn, "__wrapped__")]


def members(kind: str) -> list[str]:
    prefix = f"sequence_parallel_{kind}_"
    return sorted(m.name for m in pkgutil.iter_modules(zoo.__path__) if m.name.startswith(prefix))


def verdicts(impl, stop_on=frozenset(), max_examples: int = 4) -> tuple[list, int]:
    """Every sequence-parallel property on ``impl`` in each of its dtypes, derandomized, unshrunk: (the clauses of
    its failures, as (test, dtype, clause), and how many properties passed); stops at a clause in ``stop_on``."""
    failures, passed = [], 0
    for dtype in impl.dtypes:
        for fn in PROPERTIES:
            reason = next((mark.args[0](impl) for mark in getattr(fn, "pytestmark", [])
                           if mark.name == "applies_to"), None)
            if reason:
                continue
            inner = fn.__wrapped__
            base = inner._hypothesis_internal_use_settings
            inner._hypothesis_internal_use_settings = settings(
                base, max_examples=max_examples, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False, print_blob=False,
                suppress_health_check=list(HealthCheck))
            try:
                fn(impl=impl, device="cpu", dtype=dtype)
            except (ConformanceFailure, HungEarlier) as failure:
                failures.append((fn.__name__, dtype, failure.clause))
                if failure.clause in stop_on:
                    return failures, passed
            except pytest.skip.Exception:
                continue
            else:
                passed += 1
            finally:
                inner._hypothesis_internal_use_settings = base
    return failures, passed


# ------------------------------------------------------------------ declarations and layouts
@pytest.mark.parametrize("declared, words", [
    ({"layouts": ["diagonal"]}, "SEQUENCE_PARALLEL['layouts']=['diagonal']"),
    ({"world_sizes": {"min": 1}}, "SEQUENCE_PARALLEL['world_sizes']={'min': 1}"),
    ({"world_sizes": [2, "4"]}, "SEQUENCE_PARALLEL['world_sizes']=[2, '4']"),
    ({"heads": "some"}, "SEQUENCE_PARALLEL['heads']='some'"),
    ({"uneven_lengths": "yes"}, "SEQUENCE_PARALLEL['uneven_lengths']='yes'"),
    ({"ranks": 4}, "unknown keys ['ranks']"),
])
def test_a_bad_declaration_names_the_implementation_key_and_value(declared, words):
    class Declared:
        ARRAY = "torch"
        SEQUENCE_PARALLEL = declared

        @staticmethod
        def sdpa_sequence_parallel(q, k, v, *, group=None):
            return q

    impl = from_object(Declared, "declared", "my_module:Declared")
    with pytest.raises(DeclarationError) as raised:
        declaration_of(impl)
    assert str(raised.value).startswith("my_module:Declared: SEQUENCE_PARALLEL") and words in str(raised.value)
    with pytest.raises(pytest.UsageError, match="my_module:Declared"):  # what collection reports
        applicability(impl)


def test_uneven_lengths_cannot_be_declared_for_jax():
    with pytest.raises(DeclarationError, match="shard_map"):
        parse_declaration({"uneven_lengths": True}, "jax")


def test_a_declaration_keeps_cases_outside_it_unsupported():
    declared = parse_declaration({"layouts": ["contiguous"], "world_sizes": [2, 4], "heads": "divisible"}, "torch")
    assert declared.why_outside(4, "contiguous", 16, 8) is None
    assert "layout 'zigzag'" in declared.why_outside(4, "zigzag", 16, 8)
    assert "N = 3" in declared.why_outside(3, "contiguous", 12, 6)
    assert "uneven_lengths" in declared.why_outside(4, "contiguous", 17, 8)
    assert "Hq = 6" in declared.why_outside(4, "contiguous", 16, 6)


def test_the_layouts_are_array_split_and_head_tail():
    assert [list(shard_positions(8, 2, "zigzag", r)) for r in range(2)] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert [list(shard_positions(7, 3, "contiguous", r)) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [list(shard_positions(9, 2, "zigzag", r)) for r in range(2)] == [[0, 1, 2, 7, 8], [3, 4, 5, 6]]
    x = np.random.default_rng(0).standard_normal((1, 2, 13, 3))
    for layout in ("contiguous", "zigzag"):
        for world in (2, 3, 4, 8):
            assert np.array_equal(gather(shard(x, world, layout), layout), x)


def test_every_sequence_parallel_clause_is_in_the_spec():
    named = {clause for _, module in members_modules() for clause in module.EXPECTED_CLAUSES}
    assert named <= set(clauses()), sorted(named - set(clauses()))


def members_modules():
    return [(name, zoo.load(name)) for name in members("broken") + members("correct")]


# ------------------------------------------------------------------ the zoo and the built-ins
@pytest.mark.parametrize("member", members("broken"))
def test_broken_member_is_rejected_by_its_clause(member):
    module = zoo.load(member)
    for name in ("BUG", "SOURCE", "EXPECTED_CLAUSES"):
        assert hasattr(module, name), f"zoo/{member}.py lacks {name}"
    failures, _ = verdicts(load_implementation(f"zoo.{member}"), stop_on=module.EXPECTED_CLAUSES)
    found = {clause for _, _, clause in failures}
    assert failures, f"{member} ({module.BUG}) passed every case: the suite does not catch it"
    assert found & module.EXPECTED_CLAUSES, (f"{member} was rejected, but by {sorted(found)}, not by its bug's "
                                             f"clause {sorted(module.EXPECTED_CLAUSES)} ({module.BUG})")


@pytest.mark.parametrize("spec", [f"zoo.{m}" for m in members("correct")]
                         + ["builtin:torch_ring", "builtin:torch_ulysses", "builtin:jax_ring", "builtin:jax_ulysses"])
def test_correct_implementation_passes(spec):
    failures, passed = verdicts(load_implementation(spec))
    assert not failures, f"a correct implementation was rejected: {failures}"
    assert passed > 0


def test_a_failure_names_the_device_and_prints_a_repro():
    impl = load_implementation("zoo.sequence_parallel_broken_diagonal_skipped")
    rng = np.random.default_rng(1)
    inputs = {"q": rng.standard_normal((1, 2, 9, 4)), "k": rng.standard_normal((1, 2, 9, 4)),
              "v": rng.standard_normal((1, 2, 9, 4)), "world_size": 3, "sequence_layout": "contiguous",
              "is_causal": True, "scale": None, "window": None, "return_lse": True}
    case = Case("sdpa_sequence_parallel", inputs, ("sp.definition",), "N3 contiguous causal (a self-check)")
    with pytest.raises(ConformanceFailure) as failure:
        SequenceParallelJudge(impl, "float64", "cpu").check(case)
    text = str(failure.value)
    assert failure.value.clause == "sp.causal-blocks"
    assert "the same case passes not causal" in text and "device " in text and "attention-conformance repro " in text


# ------------------------------------------------------------------ containment
def _alive(pids: list[int]) -> list[str]:
    """ps lines of the pids that still exist, zombies included."""
    if not pids:
        return []
    shown = subprocess.run(["ps", "-o", "pid=,stat=", "-p", ",".join(map(str, pids))], capture_output=True,
                           text=True).stdout
    return [line for line in shown.splitlines() if line.strip()]


def _small_case(world: int, label: str) -> Case:
    rng = np.random.default_rng(world)
    shape = (1, 2, 4 * world, 4)
    inputs = {"q": rng.standard_normal(shape), "k": rng.standard_normal(shape), "v": rng.standard_normal(shape),
              "world_size": world, "sequence_layout": "contiguous", "is_causal": True, "scale": None,
              "window": None, "return_lse": False}
    return Case("sdpa_sequence_parallel", inputs, ("sp.definition",), label)


@pytest.mark.parametrize("stand_in, words", [
    ("HangingRing", "rank(s) [2] of 3 did not answer"),
    ("RaisingRank", "rank 0 raised: RuntimeError: rank 0 gives up before the barrier"),
])
def test_a_hung_or_failed_rank_is_contained(stand_in, words):
    impl = load_implementation(f"tests.sequence_parallel_standins:{stand_in}")
    pool = process_groups.rank_pool()
    if not pool.alive:
        pool.start()
    before, pids = pool.starts, pool.pids()
    judge = SequenceParallelJudge(impl, "float32", "cpu")
    judge.call_timeout = 3.0
    case = _small_case(3, f"{stand_in} on 3 ranks")
    try:
        with pytest.raises(ConformanceFailure) as failure:
            judge.check(case)
    finally:
        HUNG.pop(impl.spec, None)
    text = str(failure.value)
    assert case.label in text and words in text, text
    assert failure.value.clause == ("contract.result-type" if stand_in == "HangingRing" else "sp.definition")
    assert not _alive(pids), f"processes of the killed group still exist: {_alive(pids)}"
    SequenceParallelJudge(load_implementation("builtin:torch_ring"), "float32", "cpu").check(_small_case(3, "after"))
    assert pool.starts == before + 1  # a fresh group, once


def test_not_implemented_on_every_rank_is_unsupported():
    judge = SequenceParallelJudge(load_implementation("tests.sequence_parallel_standins:RefusingCausal"), "float32",
                                  "cpu")
    with pytest.raises(pytest.skip.Exception, match="no causal ring yet"):
        judge.check(_small_case(2, "a causal case it refuses"))


def test_a_hung_collective_kills_the_jax_child():
    impl = load_implementation("tests.sequence_parallel_standins:HangingCollective")
    child = process_groups.jax_child()
    if not child.alive:
        child.start()
    pids = child.pids()
    judge = SequenceParallelJudge(impl, "float32", "cpu")
    judge.call_timeout = 2.0  # four times it for a compiling implementation
    case = _small_case(4, "one device in a psum")
    try:
        with pytest.raises(ConformanceFailure) as failure:
            judge.check(case)
    finally:
        HUNG.pop(impl.spec, None)
    assert failure.value.clause == "contract.result-type"
    assert "did not answer" in str(failure.value) and case.label in str(failure.value)
    assert not _alive(pids)
    SequenceParallelJudge(load_implementation("builtin:jax_ring"), "float32", "cpu").check(_small_case(4, "after"))


def test_processes_start_once_however_many_cases_and_implementations():
    owned = process_groups.rank_pool()
    before = owned.starts if owned.alive else owned.starts + 1  # a pool not running yet starts once below
    for spec in ("builtin:torch_ring", "builtin:torch_ulysses", "zoo.sequence_parallel_correct_allgather"):
        verdicts(load_implementation(spec), max_examples=2)
    assert owned.starts == before


def test_each_xdist_worker_starts_its_processes_once(tmp_path):
    log = tmp_path / "starts.jsonl"
    env = {**os.environ, process_groups.START_LOG_VARIABLE: str(log)}
    done = subprocess.run([sys.executable, "-m", "pytest", "conformance/test_sequence_parallel.py", "-n", "2",
                           "-p", "no:cacheprovider", "-q", "-k", "torch_ring or jax_ring"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert 1 <= len(lines) <= 2 and len({line["pid"] for line in lines}) == len(lines), lines
    assert all(starts <= 1 for line in lines for kind, starts in line.items() if kind != "pid"), lines

"""Measure how much of the sequence-parallel tolerance (spec/tolerances.yaml, sequence_parallel) correct
implementations use, on real process groups and host devices.

For each implementation and declared dtype, builds cases of conformance/test_sequence_parallel.py's strategies
(every property, inside the implementation's declaration; the JAX ones at their compiling buckets) from fixed seeds,
runs each through the suite's harness and records, per quantity (out, lse, dq, dk, dv, dsink), the largest
error / allowed with the model's constants, and for the output also error / sdpa's own allowance without the merges'
term (how much the term is needed). The model is right when the first stays well under 1 (the safety factor is 4).

    python benchmarks/sequence_parallel_calibration.py [--cases 40] [--impl builtin:torch_ring ...]
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attention_conformance.conformance.cases import covering  # noqa: E402
from attention_conformance.conformance.cases.sequence_parallel import (  # noqa: E402
    DrawingPlan,
    drawing_for,
    sequence_parallel_cases,
)
from attention_conformance.conformance.harness import process_groups  # noqa: E402
from attention_conformance.conformance.harness.sequence_parallel import SequenceParallelJudge  # noqa: E402
from attention_conformance.conformance.reference.tolerances import attention_allowed  # noqa: E402
from attention_conformance.implementations.registry import load_implementation  # noqa: E402
from attention_conformance.implementations.sequence_parallel import declaration_of  # noqa: E402

IMPLS = ("builtin:torch_ring", "builtin:torch_ulysses", "zoo.sequence_parallel_correct_allgather",
         "builtin:jax_ring", "builtin:jax_ulysses")


STRATEGIES = {
    "plain": dict(clauses=("sp.definition",)),
    "window-sink": dict(clauses=("sp.window-sink",), features=("window", "sink", "both")),
    "uneven": dict(clauses=("sp.uneven",), uneven=True),
    "gradients": dict(clauses=("sp.gradients",), features=("none", "sink", "both"), gradients=True),
}


def ratios(judge, case, result) -> dict[str, float]:
    inputs = case.rounded(judge.dtype)
    want = judge.expected(case, inputs)
    found = {}

    def worst(got, expected, allowed):
        got = np.asarray(got, np.float64)
        finite = np.isfinite(expected)
        error = np.where(finite, np.abs(got - np.where(finite, expected, 0.0)), 0.0)
        allowed = np.broadcast_to(allowed, error.shape)
        return float(np.max(np.where(allowed > 0, error / np.where(allowed > 0, allowed, 1.0), 0.0), initial=0.0))

    found["out"] = worst(result["out"], want.out, want.out_allowed)
    found["out without the merges' term"] = worst(result["out"], want.out, attention_allowed(want.att, judge.dtype))
    if result.get("lse") is not None:
        found["lse"] = worst(result["lse"], want.lse, want.lse_allowed)
    for name in ("dq", "dk", "dv", "dsink"):
        if want.grads and name in want.grads and result.get(name) is not None:
            found[name] = worst(result[name], want.grads[name], want.grads_allowed[name])
    return found


def calibrate(spec: str, cases: int) -> None:
    impl = load_implementation(spec)
    plan = DrawingPlan(declaration_of(impl), impl.compiled, None, impl.region)
    for dtype in impl.dtypes:
        judge = SequenceParallelJudge(impl, dtype, "cpu")
        largest: dict[str, float] = defaultdict(float)
        judged = 0
        for name, options in STRATEGIES.items():
            if options.get("uneven") and not plan.declaration.uneven_lengths:
                continue
            for seed in range(cases):
                with drawing_for(plan):
                    try:
                        case = covering.DeterministicDraw(seed + 7919 * len(name))(sequence_parallel_cases(**options))
                    except covering.CannotBuild:
                        continue
                inputs = case.rounded(dtype)
                if judge.why_unsupported(case, inputs):
                    continue
                result = judge.execute(case, inputs)
                for quantity, ratio in ratios(judge, case, result).items():
                    largest[quantity] = max(largest[quantity], ratio)
                judged += 1
        shown = ", ".join(f"{quantity} {ratio:.3g}" for quantity, ratio in largest.items())
        print(f"{impl.name:42s} {dtype:8s} {judged:4d} cases: largest error / allowed: {shown}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=40, help="cases per strategy (default 40)")
    parser.add_argument("--impl", nargs="*", default=list(IMPLS))
    arguments = parser.parse_args()
    try:
        for spec in arguments.impl:
            calibrate(spec, arguments.cases)
    finally:
        process_groups.close_all()


if __name__ == "__main__":
    main()

"""Measure how much of the tolerance model's allowance the built-ins use.

For every built-in (CPU) and declared dtype, draws generated sdpa, softmax and
multi_head_attention cases (the same strategies as the suite), and records
error / allowed at the worst element. The constants in spec/tolerances.yaml are
right when the largest ratio stays well under 1 for correct implementations (the
safety factor is the headroom) and far above 1 for broken ones.

    python benchmarks/tolerance_calibration.py [--examples 200]
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings  # noqa: E402

from conformance import checks, strategies  # noqa: E402
from implementations import builtin_implementations, load_implementation  # noqa: E402


def worst_ratio(impl, dtype, strategy, examples: int) -> float:
    ratios = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def measure(case):
        inputs = case.rounded(dtype)
        if impl.unsupported_reason(case.op, inputs, dtype, "cpu"):
            return
        try:
            got = impl.call(case.op, case.arrays(inputs), case.options(), "cpu").astype(np.float64)
        except NotImplementedError:
            return
        policy = impl.policy_for(inputs.get("mask")) if case.op != "softmax" else "zeros"
        want = checks.expected_output(case, inputs, policy)
        allowed = np.broadcast_to(checks.allowed_error(case, inputs, dtype, policy), want.shape)
        finite = np.isfinite(want) & (allowed > 0)
        if finite.any():
            ratios.append(float(np.max(np.abs(got - want)[finite] / allowed[finite])))

    measure()
    return max(ratios) if ratios else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--impl", action="append", help="module[:attr] to measure instead of the built-ins")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    impls = [load_implementation(s) for s in args.impl] if args.impl else builtin_implementations()
    ops = {
        "sdpa": strategies.sdpa_cases(allow_empty_rows=True),
        "softmax": strategies.softmax_cases(),
        "multi_head_attention": strategies.mha_cases(),
    }
    print(f"{'implementation':<22}{'dtype':<10}" + "".join(f"{op:>22}" for op in ops))
    for impl in impls:
        if impl.skip_reason or "cpu" not in impl.devices():
            continue
        for dtype in impl.dtypes_on("cpu"):
            row = []
            for op, strategy in ops.items():
                row.append(worst_ratio(impl, dtype, strategy, args.examples) if impl.implements(op) else float("nan"))
            print(f"{impl.name:<22}{dtype:<10}" + "".join(f"{r:>22.3g}" for r in row), flush=True)


if __name__ == "__main__":
    main()

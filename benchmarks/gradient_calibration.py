"""Measure how much of the gradient tolerance (spec/tolerances.yaml, sdpa_backward) correct implementations use on the
variants' gradients (conformance/test_variant_gradients.py): softcap, the key-choosing variants with ALiBi, the
learnable sink.

For each implementation, declared CPU dtype and property, draws derandomized cases of the property's own strategy
(inside the implementation's region and signature, as the suite does) and records, per gradient (dq, dk, dv, dmask,
dsink), error / allowed at the worst element with the sdpa_backward constants 1 and no safety factor (the
calibration of the plain gradients in spec/tolerances.yaml was made the same way; the variants' constants keep their
derived values): the model is derived right when
the largest ratio stays under 1, so that the safety factor 4 leaves correct implementations a quarter of the
allowance. Broken members (--impl zoo.broken_backward_...) show how far above 1 their bug lands.

    python benchmarks/gradient_calibration.py [--examples 60] [--impl zoo.correct_torch_variant_backward ...]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from attention_conformance.conformance import test_variant_gradients as properties  # noqa: E402
from attention_conformance.conformance.cases.case import widen
from attention_conformance.conformance.cases.drawing import drawing_inside
from attention_conformance.conformance.judging.gradients import backward_allowed, gradients
from attention_conformance.conformance.reference import backward as oracle_backward
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.registry import load_implementation

IMPLS = ("builtin:torch_math", "builtin:torch_sdpa", "builtin:jax_numpy", "builtin:jax_dpa",
         "zoo.correct_torch_variant_backward")
# The sdpa_backward constants at 1 and no safety factor; the variants' own (c_alibi 2, c_sink 1, c_tanh 8) stay at
# their derived and measured values (spec/tolerances.yaml, variants and variant_gradients).
UNIT = {name: 1.0 for name in ("c_score", "c_acc", "c_out")}


def strategies() -> dict:
    """The variant gradient properties' own strategies (their Hypothesis arguments)."""
    return {name: getattr(properties, f"test_{name}_gradients").hypothesis._given_kwargs["case"]
            for name in ("softcap", "variant", "learnable_sink")}


def measure(impl, dtype: str, strategy, examples: int) -> dict:
    """{gradient: [error / allowed at its worst element, per case]}, and "cases"."""
    found: dict = defaultdict(list)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        inputs = case.rounded(dtype)
        if impl.unsupported_reason("sdpa", inputs, dtype, "cpu"):
            return
        try:
            got = gradients(impl, inputs, inputs["d_out"], "cpu")
        except NotImplementedError:
            return
        a = widen(inputs)
        args = (a["q"], a["k"], a["v"], a["d_out"], a.get("mask"), a.get("is_causal", False), a.get("scale"))
        variants = oracle.variant_options(a)
        want = oracle_backward.sdpa_backward(*args, **variants)
        allowed = backward_allowed(*args, dtype, constants=UNIT, **variants)
        found["cases"].append(case.label)
        for name in want:
            error = np.abs(np.where(np.isfinite(got[name]), got[name], np.inf) - want[name])
            found[name].append(float(np.max(np.where(allowed[name] > 0, error / allowed[name],
                                                     np.where(error > 0, np.inf, 0.0)))))

    with drawing_inside(impl.region, {"dtype": dtype, "device": "cpu"}, keywords=impl.accepted_keywords("sdpa")):
        try:
            run()
        except Unsatisfiable:  # the implementation runs none of the property's keywords
            pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=60)
    parser.add_argument("--impl", action="append", help="module[:attr] or builtin:NAME (default: the built-ins "
                                                        "with autodiff and the zoo's correct variant backward)")
    parser.add_argument("--dtype", action="append", help="only these dtypes")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print("max (median) of error / allowed with unit constants, per gradient; n: cases measured")
    for spec in args.impl or IMPLS:
        impl = load_implementation(spec)
        for dtype in impl.dtypes_on("cpu"):
            if args.dtype and dtype not in args.dtype:
                continue
            for name, strategy in strategies().items():
                found = measure(impl, dtype, strategy, args.examples)
                cases = found.pop("cases", [])
                if not cases:
                    continue
                worst = {g: (max(r), statistics.median(r)) for g, r in found.items()}
                text = "  ".join(f"{g} {m:.3g} ({med:.2g})" for g, (m, med) in worst.items())
                print(f"{impl.name:<36}{dtype:<10}{name:<16}n={len(cases):<4}{text}", flush=True)


if __name__ == "__main__":
    main()

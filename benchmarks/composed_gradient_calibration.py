"""Measure how much of the gradient tolerance correct implementations use on packed batches (sdpa_varlen, grad.varlen;
spec/tolerances.yaml sequence_gradients) and multi-head attention (grad.mha, grad.mha-variants; mha_backward).

For each implementation, declared CPU dtype and property of conformance/test_sequence_gradients.py and
conformance/test_mha_gradients.py, draws derandomized cases of the property's own strategy (inside the
implementation's region and signature, as the suite does) and records, per gradient, error / allowed at the worst
element with the sdpa_backward constants 1 and no safety factor (the multi-head model's projection errors of the
forward keep theirs, as the forward judges them): correct implementations stay under 1 when the model is derived
right. Broken members (--impl zoo.broken_...) show how far above 1 their bug lands.

    python benchmarks/composed_gradient_calibration.py [--examples 40] [--impl zoo.correct_torch_varlen_backward ...]
"""
from __future__ import annotations

import argparse
import sys
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from attention_conformance.conformance import test_mha_gradients, test_sequence_gradients  # noqa: E402
from attention_conformance.conformance.cases.drawing import drawing_inside  # noqa: E402
from attention_conformance.conformance.judging.composed_gradients import (  # noqa: E402
    allowed_gradients,
    analytic_gradients,
    op_gradients,
)
from attention_conformance.implementations.registry import load_implementation  # noqa: E402

IMPLS = ("builtin:jax_numpy", "builtin:torch_math", "builtin:torch_sdpa", "builtin:torch_nn_mha", "builtin:jax_dpa",
         "zoo.correct_torch_varlen_backward", "zoo.correct_torch_mha_variant_backward")
UNIT = {name: 1.0 for name in ("c_score", "c_acc", "c_out")}
PROPERTIES = {"varlen": (test_sequence_gradients.test_varlen_gradients, "sdpa_varlen"),
              "mha": (test_mha_gradients.test_mha_gradients, "multi_head_attention"),
              "mha-variants": (test_mha_gradients.test_mha_variant_gradients, "multi_head_attention")}


def measure(impl, dtype: str, strategy, op: str, examples: int) -> dict:
    """{gradient: largest error / allowed over the cases}, and "cases"."""
    found: dict = defaultdict(float)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        inputs = case.rounded(dtype)
        got = op_gradients(impl, op, inputs, inputs["d_out"], "cpu")
        want = analytic_gradients(op, inputs, impl.sequence_alignment)
        allowed = allowed_gradients(op, inputs, dtype, impl.sequence_alignment, constants=UNIT)
        found["cases"] += 1
        for name, exact in want.items():
            error = np.abs(got[name] - exact)
            ratio = np.where(allowed[name] > 0, error / np.where(allowed[name] > 0, allowed[name], 1.0),
                             np.where(error > 0, np.inf, 0.0))
            found[name] = max(found[name], float(ratio.max(initial=0.0)))

    with drawing_inside(impl.region, {"dtype": dtype, "device": "cpu"}, (), impl.accepted_keywords(op)):
        try:
            run()
        except Unsatisfiable:
            pass
    return dict(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--impl", nargs="*", default=list(IMPLS))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    for spec in args.impl:
        impl = load_implementation(spec)
        for label, (test, op) in PROPERTIES.items():
            if not impl.implements(op) or any(m.name == "applies_to" and m.args[0](impl)
                                              for m in getattr(test, "pytestmark", [])):
                continue
            strategy = test.hypothesis._given_kwargs["case"]
            for dtype in impl.dtypes_on("cpu"):
                found = measure(impl, dtype, strategy, op, args.examples)
                worst = max((v for k, v in found.items() if k != "cases"), default=0.0)
                print(f"{impl.name:40s} {label:13s} {dtype:9s} cases {int(found.get('cases', 0)):3d} "
                      f"max {worst:.3f}  " + " ".join(f"{k} {v:.3f}" for k, v in sorted(found.items())
                                                      if k != "cases"), flush=True)


if __name__ == "__main__":
    main()

"""What a case should give: the oracle's output and the tolerance model's allowed error, by operation.

Both the verdict (judging.py) and the attribution's probes (attribution.py) ask these of a Case;
they live apart from either so that neither module imports the other. Inputs are the case's
inputs already rounded to the dtype under test; they are widened to float64 (exactly) here, so the
oracle and the bound see the very values the implementation got.
"""
from __future__ import annotations

import numpy as np

from . import oracle, tolerances
from .cases import Case, widen


def expected_output(case: Case, inputs: dict, policy: str = "zeros") -> np.ndarray:
    """The oracle's result on (rounded, widened) inputs."""
    a = widen(inputs)
    if case.op == "softmax":
        return oracle.softmax(a["x"], axis=a.get("axis", -1))
    if case.op == "sdpa":
        return oracle.sdpa(
            a["q"], a["k"], a["v"], a.get("mask"), a.get("is_causal", False), a.get("scale"),
            fully_masked_rows_policy=policy, **oracle.variant_options(a),
        )
    return oracle.multi_head_attention(
        a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"), a.get("is_causal", False),
        fully_masked_rows_policy=policy,
    )


def allowed_error(case: Case, inputs: dict, dtype: str, policy: str = "zeros", tf32: bool = False) -> np.ndarray:
    """The tolerance model's allowed error; ``tf32``: float32 matmuls declared to run in TF32 (FLOAT32_MATMUL)."""
    a = widen(inputs)
    if case.op == "softmax":
        return tolerances.softmax_allowed(a["x"], a.get("axis", -1), dtype)
    if case.op == "sdpa":
        return tolerances.sdpa_allowed(
            a["q"], a["k"], a["v"], a.get("mask"), a.get("is_causal", False), a.get("scale"), dtype, policy, tf32=tf32,
            **oracle.variant_options(a),
        )
    return tolerances.mha_allowed(
        a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"), a.get("is_causal", False), dtype,
        tf32=tf32,
    )

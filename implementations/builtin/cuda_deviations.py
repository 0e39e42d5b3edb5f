"""CUDA kernels' measured conventions as KNOWN_DEVIATIONS entries, declared by the torch and JAX paths that use the
kernels (measured on an H100 and an H200 with torch 2.11.0+cu130 and jax 0.11.2, November 2026; docs/gpu.md).
"""
from __future__ import annotations


def _cuda_16bit(facts) -> bool:
    return facts["device"] == "cuda" and facts["dtype"] in ("float16", "bfloat16")


def _nonpositive_scale(facts) -> bool:
    return facts["scale"] is not None and facts["scale"] <= 0


# One kernel defect surfaces through every clause whose property draws a case that reaches it.
FORWARD_VALUE_CLAUSES = ("sdpa.finite", "sdpa.definition", "sdpa.any-length", "sdpa.scale-explicit",
                         "sdpa.scale-default", "sdpa.gqa-mapping", "sdpa.cross-attention", "sdpa.value-dim",
                         "causal.top-left", "causal.first-row", "causal.bottom-right-explicit", "mask.bool-true-attends",
                         "mask.float-additive", "mask.broadcast", "mask.before-softmax", "softmax.large-inputs",
                         "softmax.shift-invariance", "sdpa.key-permutation-invariance",
                         "sdpa.batch-head-independence", "sdpa.convex-combination", "dropout.p-zero")


GRADIENT_CLAUSES = ("grad.sdpa-q", "grad.sdpa-k", "grad.sdpa-v", "grad.mask", "grad.gqa-sum")


CUDA_NAN_NONPOSITIVE_SCALE = {
    "clause": FORWARD_VALUE_CLAUSES + GRADIENT_CLAUSES,
    "when": lambda facts: _cuda_16bit(facts) and _nonpositive_scale(facts),
    "reason": "H100, torch 2.11+cu130 / jax 0.11.2: the flash and cuDNN kernels (and torch's default dispatch, which "
    "picks cuDNN for 16-bit inputs) return NaN for a scale of 0 or below in float16/bfloat16, forward and backward "
    "(they assume a positive scale when they fold it into the exponent); the math kernel is right",
}


CUDA_CUDNN_FULLY_MASKED_ROWS = {
    "clause": ("mask.fully-masked-row", "mha.projections"),
    "when": lambda facts: _cuda_16bit(facts) and facts["fully_masked"],
    "reason": "H100, torch 2.11+cu130 / jax 0.11.2: cuDNN attention returns finite wrong values (errors 0.2 to 4 "
    "against zeros) for a row whose boolean mask attends no key (also inside multi-head attention)",
}


CUDA_16BIT_KERNEL_DEVIATIONS = (CUDA_NAN_NONPOSITIVE_SCALE, CUDA_CUDNN_FULLY_MASKED_ROWS)


# benchmarks/score_range_probe.py on an H200 (torch 2.11+cu130, 2026-11-27), after the suite's H100 run failed
# torch_sdpa_cudnn's outlier case (Dk 8, key padding with the causal band folded in: error 1.5 against 4.3e-3 allowed).
CUDA_CUDNN_FINITE_MASK_FILL = {
    "clause": "sdpa.score-range",
    "when": lambda facts: facts["device"] == "cuda" and facts["dtype"] == "float16" and facts["mask_kind"] != "none",
    "reason": "H100 and H200, torch 2.11+cu130: with a mask, torch's cuDNN attention (and the default dispatch, which "
    "picks it for float16) holds a removed key at a finite fill of at most 65504 below its score, not -inf, so where "
    "the scaled scores of one row span more than that (Dk 8: +-3.5e4) a removed key outweighs the kept ones. The "
    "suite's failing case is reproduced to its largest error (1.743) by any fill from -1e4 to -65504 and not by -1e5; "
    "the same output with q scaled beforehand, right without a mask and with cuDNN's own causal band, right at Dk 16 "
    "(+-2.5e4); the efficient kernel and JAX's cuDNN path are right on the same inputs",
}


# benchmarks/cudnn_backward_probe.py replayed the failing cases of the suite's first GPU run of torch_sdpa_cudnn.
CUDA_CUDNN_MASKED_BACKWARD_NAN = {
    "clause": "grad.sdpa-q",
    "when": lambda facts: _cuda_16bit(facts) and facts["mask_kind"] != "none",
    "reason": "H200, torch 2.11+cu130: cuDNN attention's backward returns NaN for a whole row of dq (the analytic "
    "gradient finite, 0 or -3.7e-98) where a mask (the causal band folded in) leaves the row's softmax one-hot to "
    "float32 precision: one attended key, or the others 1e-98 and less below it (an explicit scale of 2.5, or large "
    "scores); failed in both GPU runs; in isolation 3 of 3 calls, with enable_gqa or repeated kv heads, the mask "
    "boolean or a float -inf bias alike; 0 of 80 random unit-score cases. dk and dv of those rows not measured",
}

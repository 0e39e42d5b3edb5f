"""Correct kernel stand-in: float32 matmuls in TF32, declared (FLOAT32_MATMUL = {"cpu": "tf32"}).

The very computation of ``kernel_broken_tf32_undeclared`` (float32 matmul operands q, k, P, v
rounded to TF32, float32 accumulation), with the declaration that makes it conforming: the
tolerance then allows TF32 rounding of the matmul inputs (spec/tolerances.yaml, tf32).
"""
from zoo import kernel_correct as kernel

BUG = "none"
SOURCE = "TF32 tensor-core matmuls (torch allow_tf32, JAX default precision), declared"
EXPECTED_CLAUSES = frozenset()
DTYPES = kernel.DTYPES
SUPPORTS = kernel.SUPPORTS
FLOAT32_MATMUL = {"cpu": "tf32"}


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return kernel.flash_forward(q, k, v, mask, is_causal, scale, matmul_input=kernel.to_tf32 if q.dtype.name == "float32" else kernel.same)

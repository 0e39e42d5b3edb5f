"""Broken kernel stand-in: float32 matmuls run in TF32 without declaring FLOAT32_MATMUL.

Identical to ``kernel_correct`` except for the marked line: for float32 inputs the matmul
operands q, k, P and v are rounded to TF32 (10 explicit mantissa bits, round-to-nearest-even;
float32 accumulation), as tensor cores do with torch.backends.cuda.matmul.allow_tf32 or JAX's
default matmul precision, while the member declares plain IEEE float32. ``kernel_correct_tf32``
is the same computation with the declaration, and must pass.
"""
from zoo import kernel_correct as kernel

BUG = ("float32 matmul inputs (q, k, P, v) are rounded to TF32 (unit roundoff 2^-11 instead of 2^-24) "
       "while the member declares plain IEEE float32 (no FLOAT32_MATMUL = 'tf32').")
SOURCE = "TF32 tensor-core matmuls (torch allow_tf32, JAX default precision) on Ampere and later GPUs"
EXPECTED_CLAUSES = frozenset({"sdpa.definition"})
# kernel_correct's dtypes, float32 first: the self-check battery (tests/battery.py) goes dtype by dtype
# in this order and stops at the first verdict naming EXPECTED_CLAUSES, which only float32 can give.
DTYPES = ("float32", "float16", "bfloat16")
assert set(DTYPES) == set(kernel.DTYPES)
SUPPORTS = kernel.SUPPORTS


def tf32_for_float32(q):
    return kernel.to_tf32 if q.dtype.name == "float32" else kernel.same  # BUG: undeclared TF32


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return kernel.flash_forward(q, k, v, mask, is_causal, scale, matmul_input=tf32_for_float32(q))

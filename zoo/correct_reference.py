"""Correct: the zoo's own float64 reference (zoo/_reference.py), re-exported.

Baseline member: if the suite rejects this one, the suite (or the reference) is wrong.
"""
from zoo import _reference as ref

BUG = "none"
SOURCE = "zoo/_reference.py (float64 NumPy reference)"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32", "float16", "bfloat16")

softmax = ref.softmax
sdpa = ref.sdpa
multi_head_attention = ref.multi_head_attention

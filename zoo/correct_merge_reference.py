"""Correct: merge_states as FlashInfer's MergeStatesKernel computes it, in float32 (zoo/_merge_member.py)."""
from zoo import _merge_member

BUG = "none"
SOURCE = "FlashInfer include/flashinfer/attention/cascade.cuh MergeStatesKernel (max subtracted, float32), in natural log"
EXPECTED_CLAUSES = frozenset()
DTYPES = _merge_member.DTYPES
merge_states = _merge_member.merge_states_with()

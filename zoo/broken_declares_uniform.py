"""Broken: declares FULLY_MASKED_ROWS = 'uniform' but returns zeros for such rows."""
from zoo import _reference as ref

BUG = ("the member declares FULLY_MASKED_ROWS = 'uniform' (mean of v) but its sdpa and "
       "multi_head_attention return zeros for fully masked rows (the reference behaviour).")
SOURCE = "known bug class (declared deviation must be the real behaviour)"
EXPECTED_CLAUSES = frozenset({"mask.fully-masked-row"})
FULLY_MASKED_ROWS = "uniform"  # BUG: the code below gives zeros

sdpa = ref.sdpa
multi_head_attention = ref.multi_head_attention

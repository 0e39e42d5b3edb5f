"""Broken: the merge exponentiates each part's lse as it is, without subtracting the largest."""
import numpy as np

from zoo import _merge_member

BUG = "w_p = exp(lse_p), lse = log sum_p w_p: exp overflows past lse 88.7 in float32 (inf / inf = NaN) and underflows below -103 (0 / 0)."
SOURCE = "known bug class (the max subtraction of a stable log-sum-exp left out; the naive column of FlashInfer's merge tests)"
EXPECTED_CLAUSES = frozenset({"merge.union", "merge.empty-part", "merge.order", "merge.sink-once"})
DTYPES = _merge_member.DTYPES
merge_states = _merge_member.merge_states_with(top=lambda lse, sink: np.zeros(lse.shape[1:], dtype=lse.dtype))  # BUG

"""Broken: FlashInfer's base-2 merge fed natural-log lse (and returning base 2), undeclared."""
import numpy as np

from zoo import _merge_member

BUG = "the merge takes lse_p as base 2 (exp2(lse_p - m), m + log2 Z) while the parts' lse is a natural log: weights and lse off by a factor of ln 2 in the exponent."
SOURCE = "sglang#40903 and vLLM PR #43729 (FlashAttention's natural lse into FlashInfer's base-2 merge_state)"
EXPECTED_CLAUSES = frozenset({"merge.union", "merge.empty-part", "merge.order", "merge.sink-once", "lse.base"})
DTYPES = _merge_member.DTYPES


def _merged_lse(total, m):
    with np.errstate(divide="ignore"):
        return np.where(total > 0, m + np.log2(np.where(total > 0, total, 1.0)), -np.inf)


merge_states = _merge_member.merge_states_with(weights=lambda lse, m: np.exp2(lse - m),  # BUG: base 2
                                               sink_term=lambda sink, m, parts: 0.0 if sink is None
                                               else np.exp2(sink * np.log2(np.e) - m), merged_lse=_merged_lse)

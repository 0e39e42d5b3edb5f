"""Correct: FlashInfer's merge in base 2 (exp2 and log2 of base-2 lse), declared in LSE_CONVENTION; the sink, a
natural logit, taken to base 2 first (FlashInfer's AttentionSink: sink * log2(e))."""
import numpy as np

from zoo import _merge_member

BUG = "none"
SOURCE = "FlashInfer include/flashinfer/attention/cascade.cuh MergeStateKernel (s_max; exp2(s - s_max); log2(d) + s_max)"
EXPECTED_CLAUSES = frozenset()
DTYPES = _merge_member.DTYPES
LSE_CONVENTION = {"base": "2"}


def _merged_lse(total, m):
    with np.errstate(divide="ignore"):
        return np.where(total > 0, m + np.log2(np.where(total > 0, total, 1.0)), -np.inf)


merge_states = _merge_member.merge_states_with(weights=lambda lse, m: np.exp2(lse - m),
                                               sink_term=lambda sink, m, parts: 0.0 if sink is None
                                               else np.exp2(sink * np.log2(np.e) - m), merged_lse=_merged_lse)

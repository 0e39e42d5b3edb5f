"""Broken: the merge adds the learnable sink's term once per part instead of once."""
import numpy as np

from zoo import _merge_member

BUG = "Z = sum_p exp(lse_p - m) + P exp(sigma - m): the sink weighs P times (FlashAttention 4 called per ring step with learnable_sink)."
SOURCE = "known bug class (the sink in every split's lse; vLLM's FlashAttention 3 and FlashInfer add it in split 0 only)"
EXPECTED_CLAUSES = frozenset({"merge.sink-once"})
DTYPES = _merge_member.DTYPES
merge_states = _merge_member.merge_states_with(
    sink_term=lambda sink, m, parts: 0.0 if sink is None else parts * np.exp(sink - m))  # BUG: once per part

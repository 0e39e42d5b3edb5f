"""Broken: each part's output is weighted with another part's weight (the two halves of a merge_state swapped)."""
import numpy as np

from zoo import _merge_member

BUG = "out = sum_p w_(P-1-p) out_p: part p's value gets the weight of the part opposite it (v_a * s_b + v_b * s_a)."
SOURCE = "known bug class (operands of a two-state merge swapped)"
EXPECTED_CLAUSES = frozenset({"merge.union", "merge.empty-part", "merge.order", "merge.sink-once"})
DTYPES = _merge_member.DTYPES


def _weights(lse, m):
    return np.exp(lse - m)[::-1]  # BUG: the weights in the other order


merge_states = _merge_member.merge_states_with(weights=_weights)

"""Broken: the learnable sink's term is counted twice in the lse (a split-KV kernel adding it in each of two splits)."""
import numpy as np

from zoo import _lse_member
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "with a learnable sink, lse = log(2 exp(sigma) + sum_j exp(s_j)): the sink's term in both halves of a split."
SOURCE = "known bug class: a sink added per KV split (FlashAttention 4's lse called per ring step counts it per step)"
EXPECTED_CLAUSES = frozenset({"lse.learnable-sink"})
DTYPES = _lse_member.DTYPES


def _lse(s, sink):
    if sink is None:
        return base.lse(s, None)
    return base.lse(np.concatenate([s, np.broadcast_to(sink, s.shape[:-1] + (1,))], axis=-1), sink)  # BUG: twice


sdpa = _lse_member.sdpa_with_lse(_lse)

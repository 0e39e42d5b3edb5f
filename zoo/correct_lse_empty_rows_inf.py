"""Correct: a row without keys has lse +inf, declared (FlashAttention 2 keeps +inf so that its backward's
exp(s - lse) is 0)."""
import numpy as np

from zoo import _lse_member
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "none"
SOURCE = "flash-attention csrc/flash_attn/src/softmax.h normalize_softmax_lse (INFINITY for an empty row)"
EXPECTED_CLAUSES = frozenset()
DTYPES = _lse_member.DTYPES
LSE_CONVENTION = {"empty_row": "+inf"}


def _lse(s, sink):
    lse = base.lse(s, sink)
    return np.where(np.isneginf(lse), np.inf, lse)


sdpa = _lse_member.sdpa_with_lse(_lse)

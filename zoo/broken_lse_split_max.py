"""Broken: a split-KV decode combines its two splits' lse by their maximum, not their log-sum-exp."""
import numpy as np

from zoo import _lse_member
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "for Lk > 64 the keys run in two halves whose lse are combined as max(lse_a, lse_b) (the output combined right): off by up to log 2."
SOURCE = "known bug class (flash-decoding's combine step written with max instead of logaddexp)"
EXPECTED_CLAUSES = frozenset({"lse.definition", "lse.variants", "lse.learnable-sink", "lse.paged", "lse.varlen"})
DTYPES = _lse_member.DTYPES


def _lse(s, sink):
    lk = s.shape[-1]
    if lk <= 64:
        return base.lse(s, sink)
    half = lk // 2
    first, second = base.lse(s[..., :half], sink), base.lse(s[..., half:], None)
    return np.maximum(first, second)  # BUG: max, not logaddexp


sdpa = _lse_member.sdpa_with_lse(_lse)

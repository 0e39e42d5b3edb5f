"""Broken: the lse is in base 2 and nothing says so (a FlashInfer-style lse handed to a natural-log merge)."""
import math

from zoo import _lse_member
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "the lse is log2 of the normaliser (m log2 e + log2 Z) without LSE_CONVENTION {'base': '2'}: 1 / ln 2 times the natural one."
SOURCE = "known bug class: base mix-ups in merges (sglang#40903, flashinfer#2113, flashinfer#4485)"
EXPECTED_CLAUSES = frozenset({"lse.base"})
DTYPES = _lse_member.DTYPES
sdpa = _lse_member.sdpa_with_lse(lambda s, sink: base.lse(s, sink) / math.log(2.0))  # BUG: undeclared base 2

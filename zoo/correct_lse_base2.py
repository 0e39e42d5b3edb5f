"""Correct: the log-sum-exp in base 2, declared (FlashInfer's return_lse, the Pallas GPU kernel's residual)."""
import math

from zoo import _lse_member
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "none"
SOURCE = "FlashInfer include/flashinfer/attention/state.cuh get_lse (m + log2(d)); declared LSE_CONVENTION base 2"
EXPECTED_CLAUSES = frozenset()
DTYPES = _lse_member.DTYPES
LSE_CONVENTION = {"base": "2"}
sdpa = _lse_member.sdpa_with_lse(lambda s, sink: base.lse(s, sink) / math.log(2.0))

"""Broken: the lse leaves the learnable sink out while declaring nothing (its output divides by the sink's term)."""
from zoo import _lse_member
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "with a learnable sink the lse is the keys' alone, log sum_j exp(s_j), though the output's normaliser holds the sink (LSE_CONVENTION sink 'included' by default)."
SOURCE = "gpt-oss gpt_oss/triton/attention.py (M excludes the sink) used where the sink's term is expected"
EXPECTED_CLAUSES = frozenset({"lse.learnable-sink"})
DTYPES = _lse_member.DTYPES
sdpa = _lse_member.sdpa_with_lse(lambda s, sink: base.lse(s, None))  # BUG: the sink's term left out, undeclared

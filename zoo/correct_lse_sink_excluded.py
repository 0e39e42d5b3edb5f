"""Correct: the lse leaves the learnable sink's term out, declared (gpt-oss's Triton kernel keeps the keys' alone)."""
from zoo import _lse_member
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "none"
SOURCE = "gpt-oss gpt_oss/triton/attention.py _attn_fwd (M = m_i + log(l_i), the sink only in z); declared"
EXPECTED_CLAUSES = frozenset()
DTYPES = _lse_member.DTYPES
LSE_CONVENTION = {"sink": "excluded"}
sdpa = _lse_member.sdpa_with_lse(lambda s, sink: base.lse(s, None))

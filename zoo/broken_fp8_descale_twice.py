"""Broken: every descale factor applied twice (a wrapper that dequantizes q, k, v and then hands the same factors to
a kernel that descales again), on FlashAttention 3's FP8 forward (zoo/correct_fp8_fa3_emulation.py)."""
from __future__ import annotations

from zoo import correct_fp8_fa3_emulation as fa3

BUG = ("q, k and v are each scaled by their descale factor twice: the scores by (q_descale * k_descale)^2, the output "
       "by v_descale^2 (right only where every factor is 1)")
SOURCE = "known bug class (an FP8 descale applied twice); a wrapper dequantizing before FlashAttention 3's descaling kernel"
EXPECTED_CLAUSES = frozenset({"sdpa.fp8-descale"})
DTYPES = fa3.DTYPES


def twice(q_descale, k_descale, v_descale, hq):
    return tuple(factor * factor for factor in fa3.descale_factors(q_descale, k_descale, v_descale, hq))  # BUG


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
         query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
    return fa3.attend(q, k, v, mask, is_causal, scale, window, softcap, query_offset, key_lengths,
                      q_descale, k_descale, v_descale, factors=twice)

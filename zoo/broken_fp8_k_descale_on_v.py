"""Broken: the output scaled by k's descale factor instead of v's (finalize(k_descale): a copy-paste of the factor
the scores took), on FlashAttention 3's FP8 forward (zoo/correct_fp8_fa3_emulation.py)."""
from __future__ import annotations

from zoo import correct_fp8_fa3_emulation as fa3

BUG = "v is dequantized with k_descale instead of v_descale (right only where the two are equal)"
SOURCE = "known bug class (FP8 descales); FlashAttention 3 softmax.finalize(v_descale) with the wrong factor"
EXPECTED_CLAUSES = frozenset({"sdpa.fp8-descale"})
DTYPES = fa3.DTYPES


def k_factor_on_v(q_descale, k_descale, v_descale, hq):
    qd, kd, _ = fa3.descale_factors(q_descale, k_descale, v_descale, hq)
    return qd, kd, kd  # BUG


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
         query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
    return fa3.attend(q, k, v, mask, is_causal, scale, window, softcap, query_offset, key_lengths,
                      q_descale, k_descale, v_descale, factors=k_factor_on_v)

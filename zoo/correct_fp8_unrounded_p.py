"""Correct: FlashAttention 3's FP8 forward (zoo/correct_fp8_fa3_emulation.py) with P kept in float32 for P @ V.

A kernel that does not round the attention weights to 8 bits before the second matmul (a float32 or 16-bit P, as the
FP8-KV-cache paths of FlashInfer and vLLM that dequantize K and V have) is more accurate than FlashAttention 3, not
less: the contract is the attention of the dequantized inputs, and P's rounding is an allowance of the tolerance
(spec/tolerances.yaml, eight_bit), never a requirement. It must pass.
"""
from __future__ import annotations

from zoo import correct_fp8_fa3_emulation as fa3

BUG = "none"
SOURCE = "spec/tolerances.yaml eight_bit (P's rounding allowed, not required); FlashInfer / vLLM FP8 KV caches dequantized"
EXPECTED_CLAUSES = frozenset()
DTYPES = fa3.DTYPES
FP8_OUTPUT_DTYPE = "bfloat16"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
         query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
    return fa3.attend(q, k, v, mask, is_causal, scale, window, softcap, query_offset, key_lengths,
                      q_descale, k_descale, v_descale, round_p=lambda p, fmt: p)

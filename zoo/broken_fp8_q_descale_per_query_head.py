"""Broken: q_descale read per query head, q_descale[b, h % Hkv] (as if it were (B, Hq) and tiled), instead of at the
kv head of the query head's group, q_descale[b, h // G], on FlashAttention 3's FP8 forward
(zoo/correct_fp8_fa3_emulation.py)."""
from __future__ import annotations

import numpy as np

from zoo import correct_fp8_fa3_emulation as fa3

BUG = ("query head h takes q_descale[b, h % Hkv] (tiled over the query heads) instead of q_descale[b, h // (Hq / Hkv)]; "
       "right without grouped-query attention, with one kv head, or with equal factors")
SOURCE = ("flash-attention hopper/flash_api.cpp: q_descale is '(b, h_k), not (b, h)'; torch "
          "_scaled_dot_product_attention_quantized: q_descale broadcast from (B, H_kv) to the query heads")
EXPECTED_CLAUSES = frozenset({"sdpa.fp8-descale", "sdpa.gqa-mapping"})
DTYPES = fa3.DTYPES


def tiled_q_factor(q_descale, k_descale, v_descale, hq):
    _, kd, vd = fa3.descale_factors(q_descale, k_descale, v_descale, hq)
    if q_descale is None:
        return np.ones((1, 1, 1, 1), dtype=fa3.F32), kd, vd
    factors = np.asarray(q_descale, dtype=fa3.F32)
    return np.tile(factors, (1, hq // factors.shape[1]))[:, :, None, None], kd, vd  # BUG: tile, not repeat


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
         query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
    return fa3.attend(q, k, v, mask, is_causal, scale, window, softcap, query_offset, key_lengths,
                      q_descale, k_descale, v_descale, factors=tiled_q_factor)

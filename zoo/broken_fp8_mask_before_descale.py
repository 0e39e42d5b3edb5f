"""Broken: an 8-bit case's float mask added to the raw q.k, before the descales, which then multiply it."""
import numpy as np

from zoo import correct_fp8_dequant_bf16 as base

BUG = ("the float mask is added to the scores of the stored 8-bit values and scale * q_descale * k_descale applied "
       "after, so each mask value is multiplied by its head's factors: right only where they are 1.")
SOURCE = ("zoo extra: an independently written FP8 path (2026-11-28) that default runs drawing no float mask in "
          "8-bit cases passed")
EXPECTED_CLAUSES = frozenset({"mask.float-additive", "sdpa.fp8-descale"})
DTYPES = base.DTYPES
FP8_OUTPUT_DTYPE = base.FP8_OUTPUT_DTYPE


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
         query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
    if mask is not None and np.asarray(mask).dtype != np.bool_ and q_descale is not None and k_descale is not None:
        b, hq = np.shape(q)[:2]
        group = hq // np.shape(k_descale)[1]
        factors = np.repeat(np.asarray(q_descale, np.float32) * np.asarray(k_descale, np.float32), group, axis=1)
        mask = np.broadcast_to(mask, (b, hq) + np.shape(mask)[-2:]) * factors[:, :, None, None]  # BUG
    return base.sdpa(q, k, v, mask, is_causal, scale, window=window, softcap=softcap, query_offset=query_offset,
                     query_lengths=query_lengths, key_lengths=key_lengths, q_descale=q_descale, k_descale=k_descale,
                     v_descale=v_descale)

"""Broken: the softcap path of FlashAttention 3's FP8 forward (zoo/correct_fp8_fa3_emulation.py) without its
`softcap_val *= q_descale * k_descale`: with a softcap the descales leave the exponent's factor (the scale is applied
before tanh there), and nothing puts them back, so the scores are those of the stored values."""
from __future__ import annotations

import numpy as np

from zoo import correct_fp8_fa3_emulation as fa3

BUG = ("with a softcap, q_descale and k_descale are not applied: softcap * tanh(scale * q.k / softcap) of the stored "
       "values (right only where q_descale * k_descale = 1)")
SOURCE = ("flash-attention hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp (if constexpr (Has_softcap && Is_FP8) softcap_val "
          "*= q_descale * k_descale) and flash_fwd_kernel_sm90.h (the descales join softmax_scale_log2 only without a "
          "softcap): the line this member leaves out")
EXPECTED_CLAUSES = frozenset({"sdpa.fp8-descale"})
DTYPES = fa3.DTYPES


def capped_without_descales(s, scale, softcap, qd, kd):
    return np.tanh(s * fa3.F32(scale / fa3.F32(softcap))).astype(fa3.F32)  # BUG: no q_descale * k_descale


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
         query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
    return fa3.attend(q, k, v, mask, is_causal, scale, window, softcap, query_offset, key_lengths,
                      q_descale, k_descale, v_descale, capped=capped_without_descales)

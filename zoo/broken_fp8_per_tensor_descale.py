"""Broken: the first (batch, kv head)'s descale factor used for every head and example (code written for
per-tensor scales, as FlashInfer's k_scale / v_scale and vLLM's layer scales are, reading descale[0, 0]), on
FlashAttention 3's FP8 forward (zoo/correct_fp8_fa3_emulation.py)."""
from __future__ import annotations

import numpy as np

from zoo import correct_fp8_fa3_emulation as fa3

BUG = ("each of q_descale, k_descale, v_descale is read at [0, 0] and applied to every batch element and head: per "
       "tensor instead of per (batch, kv head); right only where all of a tensor's factors are equal")
SOURCE = "known bug class (an FP8 descale per tensor instead of per head); vLLM/FlashInfer per-tensor k_scale, v_scale"
EXPECTED_CLAUSES = frozenset({"sdpa.fp8-descale"})
DTYPES = fa3.DTYPES


def first_entry(q_descale, k_descale, v_descale, hq):
    return tuple(np.ones((1, 1, 1, 1), dtype=fa3.F32) if d is None
                 else np.full((1, 1, 1, 1), np.asarray(d, dtype=fa3.F32).ravel()[0])  # BUG
                 for d in (q_descale, k_descale, v_descale))


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
         query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
    return fa3.attend(q, k, v, mask, is_causal, scale, window, softcap, query_offset, key_lengths,
                      q_descale, k_descale, v_descale, factors=first_entry)

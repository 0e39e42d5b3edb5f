"""Broken: a split-KV decode path that takes every row's causal limit from the last query.

A flash-decoding kernel written for one new token per sequence: for Lq <= 8 against more than one key tile it
computes the causal key limit once, from the last query (key j kept where j <= Lq - 1), and masks every row
with it. With one query that is exact; with a few (speculative decoding) each row but the last attends keys
right of its diagonal. Prefill (Lq > 8), Lk <= 64 and non-causal calls run ``kernel_correct``'s band, exact.
A causal decode case with one query cannot show it; the causal spec-decode corner (Lq 4 against 193 keys) does.
"""
import numpy as np

from zoo import kernel_correct as kernel

BUG = ("under is_causal, for Lq <= 8 and Lk > 64 (its decode path), every query row keeps the keys up to the "
       "last query's position: rows before the last attend future keys.")
SOURCE = "zoo extra: an independently written NumPy split-KV decode kernel (2026-11-27)"
EXPECTED_CLAUSES = frozenset({"causal.top-left"})
DTYPES = kernel.DTYPES
DECODE_MAX_LQ = 8


def last_query_band(mask, is_causal, b, hq, lq, lk):
    if not (is_causal and lq <= DECODE_MAX_LQ and lk > kernel.TILE):
        return kernel.attention_bias(mask, is_causal, b, hq, lq, lk)
    base = kernel.attention_bias(mask, False, b, hq, lq, lk)
    return np.where(np.arange(lk) <= lq - 1, base, -np.inf).astype(base.dtype)  # BUG: the last row's limit for all


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return kernel.flash_forward(q, k, v, mask, is_causal, scale, bias_fn=last_query_band)

"""Broken: ALiBi slopes read in the tiled GQA head order, by an implementation without query_offset."""
import numpy as np

from zoo import _reference as ref
from zoo import correct_variants_reference as base

BUG = ("with grouped kv heads (1 < Hkv < Hq) query head h = n * G + g gets slope[g * Hkv + n] (the order of "
       "k.repeat, not of repeat_interleave): the identity for MHA and MQA, wrong for GQA.")
SOURCE = ("zoo extra: an independently written jitted JAX GQA kernel that laid its slopes out as (G, Hkv) "
          "(2026-11-27). Its sdpa has no query_offset; the ALiBi property judges it at offset 0")
EXPECTED_CLAUSES = frozenset({"sdpa.alibi", "sdpa.variant-order"})
DTYPES = base.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, alibi_slopes=None):
    hkv = np.shape(k)[1]

    def alibi(slopes, heads, lq, lk, query_offset):
        rows = ref.as64(slopes).reshape(-1, heads)
        group = heads // hkv
        tiled = rows.reshape(-1, group, hkv).transpose(0, 2, 1).reshape(-1, heads)  # BUG: (G, Hkv), not (Hkv, G)
        return base.alibi(tiled, heads, lq, lk, query_offset)

    return base.attend(q, k, v, mask, is_causal, scale, None, None, alibi_slopes, 0, None, None, alibi=alibi)

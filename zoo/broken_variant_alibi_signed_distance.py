"""Broken: the ALiBi bias uses the signed distance p_i - j, not |p_i - j|: keys ahead of the query are rewarded."""
import numpy as np

from zoo import _reference as ref
from zoo import correct_variants_reference as base

BUG = "bias -slope * (p_i - j) without the absolute value: future keys (j > p_i) get a positive bias."
SOURCE = "known bug class (ALiBi sign / distance); the causal-only ALiBi form copied into a bidirectional kernel"
EXPECTED_CLAUSES = frozenset({"sdpa.alibi", "sdpa.variant-order"})
DTYPES = base.DTYPES


def alibi(slopes, hq, lq, lk, query_offset):
    slopes = ref.as64(slopes).reshape(-1, hq)
    distance = base.query_positions(lq, query_offset) - np.arange(lk)[None, :]  # BUG: |p_i - j| in the contract
    return -slopes[:, :, None, None] * distance


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, alibi=alibi)

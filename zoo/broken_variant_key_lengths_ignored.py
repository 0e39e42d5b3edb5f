"""Broken: key_lengths ignored, so every example attends its padding keys (a packed batch leaking across examples)."""
import numpy as np

from zoo import correct_variants_reference as base

BUG = "key_lengths are accepted and ignored: keys past an example's length (its padding, or the next sequence) leak in."
SOURCE = "known bug class (a packed batch leaking across sequence boundaries)"
EXPECTED_CLAUSES = frozenset({"sdpa.varlen", "sdpa.variant-order", "mask.fully-masked-row"})
DTYPES = base.DTYPES


def length_keep(key_lengths, lk):
    return np.ones((1, 1, 1, lk), dtype=bool)  # BUG: the contract keeps j < key_lengths[b]


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, length_keep=length_keep)

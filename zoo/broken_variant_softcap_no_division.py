"""Broken: softcap * tanh(s) instead of softcap * tanh(s / softcap)."""
import numpy as np

from zoo import correct_variants_reference as base

BUG = "the softcap forgets the inner division: softcap * tanh(s), which saturates at |s| ~ 1 whatever the cap."
SOURCE = "known bug class (softcap); a common slip when porting Gemma's logit softcapping"
EXPECTED_CLAUSES = frozenset({"sdpa.softcap", "sdpa.variant-order"})
DTYPES = base.DTYPES


def capped(s, softcap):
    return softcap * np.tanh(s)  # BUG: the contract divides by softcap inside tanh


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, capped=capped)

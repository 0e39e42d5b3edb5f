"""Broken: softcap applied after the mask is added, so a masked key's -inf becomes -softcap and leaks."""
from zoo import correct_variants_reference as base

BUG = "softcap * tanh(.) is applied to the masked scores: -inf becomes -softcap, masked keys get weight."
SOURCE = "known bug class (softcap applied after the mask); Gemma/FlashAttention cap before masking"
EXPECTED_CLAUSES = frozenset({"sdpa.softcap", "sdpa.variant-order", "sdpa.window", "sdpa.varlen",
                              "mask.fully-masked-row"})
DTYPES = base.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths, cap_after_mask=True)  # BUG: the contract caps before any mask

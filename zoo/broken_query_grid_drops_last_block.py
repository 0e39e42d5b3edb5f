"""Broken: the query grid covers whole blocks of 128 only, so rows past the last full block stay zero."""

from zoo import _reference as ref

BUG = "for Lq > 128 the grid has Lq // 128 query blocks (not a ceiling): the last Lq % 128 rows are left zero."
SOURCE = "an independently written implementation; a launch grid of Lq // BLOCK_M instead of cdiv(Lq, BLOCK_M)"
EXPECTED_CLAUSES = ref.SDPA_VALUE_CLAUSES
BLOCK = 128


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    out = ref.sdpa(q, k, v, mask, is_causal, scale)
    lq = out.shape[-2]
    if lq > BLOCK:
        out[..., lq - lq % BLOCK:, :] = 0  # BUG: the partial last query block is never launched
    return out

"""Broken: a blocked kernel (key blocks of 8) that skips the partial last block when Lk > 8."""
import numpy as np

from zoo import correct_flash_blockwise as flash

BUG = ("keys are visited in blocks of 8 and the loop stops at the last full block, so for Lk > 8 "
       "the Lk % 8 trailing keys are never attended (exact for Lk <= 8 and for multiples of 8).")
SOURCE = "the commonest blocked-kernel bug; flash-attention's tests sweep lengths such as 113 and 1023 for it"
EXPECTED_CLAUSES = frozenset({"sdpa.any-length"})
DTYPES = flash.DTYPES

BLOCK = 8


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    lk = np.asarray(k).shape[-2]
    seen = lk if lk <= BLOCK else lk - lk % BLOCK  # BUG: the partial tail block is dropped
    if mask is not None and np.asarray(mask).shape[-1] == lk:
        mask = np.asarray(mask)[..., :seen]
    # The causal band is top-left aligned, so it is the same band on the first `seen` keys.
    return flash.sdpa(q, np.asarray(k)[..., :seen, :], np.asarray(v)[..., :seen, :], mask, is_causal, scale)

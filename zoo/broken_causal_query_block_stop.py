"""Broken: a causal tiled kernel (query blocks of 128, key blocks of 64) ends its key loop at the first row."""
from zoo import correct_flash_blockwise as flash

BUG = ("query blocks of 128 rows, key blocks of 64; under is_causal the key loop of a query block stops after the "
       "block holding the key of its first row instead of its last, so rows 64..127 of a block lose the keys "
       "first + 64 .. row (wrong for causal cases with Lq and Lk past 64).")
SOURCE = ("an independently written tiled kernel (2026-11-25): small-shape corners fit in one tile; a causal "
          "kernel-shaped Lq = Lk = 65 case has row 64 attend key 64")
EXPECTED_CLAUSES = frozenset({"causal.top-left", "sdpa.any-length"})
DTYPES = flash.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return flash.tiled(q, k, v, mask, is_causal, scale, query_block=128, key_block=64,
                       causal_stop_row=lambda first, last: first)  # BUG: the first row's key, not the last's

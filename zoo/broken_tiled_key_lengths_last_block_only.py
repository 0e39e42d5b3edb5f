"""Broken: a tiled kernel applies key_lengths in its last key block only."""
from zoo import correct_flash_tiled_variants as tiled

BUG = ("key blocks of 64; key_lengths masks keys j >= length only in the last key block, so where a sequence's "
       "length ends before the last block of 64 keys its padding keys in the earlier blocks are attended.")
SOURCE = "an independently written tiled kernel (2026-11-25): random draws alone caught it in one of two default runs"
EXPECTED_CLAUSES = frozenset({"sdpa.varlen"})
DTYPES = tiled.DTYPES


sdpa = tiled.with_hooks(lengths_in_block=lambda start, stop, lk: stop == lk)  # BUG: the last block only

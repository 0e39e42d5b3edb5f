"""Broken kernel stand-in: the partial last key tile of 64 is never visited.

Identical to ``kernel_correct`` except for the marked line: the tile loop stops at the last
full tile, so for Lk > 64 with Lk % 64 != 0 the trailing Lk % 64 keys are ignored (exact for
Lk <= 64 and for multiples of 64) -- the commonest blocked-kernel bug.
"""
from zoo import kernel_correct as kernel

BUG = ("key tiles of 64 are visited up to the last full tile only, so for Lk > 64 and Lk % 64 != 0 the "
       "trailing Lk % 64 keys are never attended.")
SOURCE = "the commonest blocked-kernel bug; flash-attention's tests sweep seqlens such as 113, 203 and 1023 for it"
EXPECTED_CLAUSES = frozenset({"sdpa.any-length"})
DTYPES = kernel.DTYPES
SUPPORTS = kernel.SUPPORTS


def full_tiles_only(lk):
    tiles = kernel.key_tiles(lk)
    return tiles if lk <= kernel.TILE else [t for t in tiles if t[1] - t[0] == kernel.TILE]  # BUG


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return kernel.flash_forward(q, k, v, mask, is_causal, scale, tiles=full_tiles_only)

"""Broken: a blocked kernel whose masked tail path builds the causal band from the tile-local key index.

Key tiles of 64 as ``kernel_correct`` visits them; full tiles compare the global key index with the row
(j <= i), but the partial last tile, which a Triton kernel loads under a bounds mask with the tile-local
offsets ``offs_n``, reuses those offsets for the causal comparison. So under is_causal, for Lk > 64 with a
tail of two keys or more, a query row in the tail tile attends tail keys right of the diagonal (Lq = Lk = 100:
row 64 attends keys 64..99). Exact where the tail is one key (65, 129: the local 0 is then at or left of every
row that reaches it), for Lk <= 64 (the tail is tile 0) and for multiples of 64. Tile corners one off a
block (65, 129) miss it; the tile property's causal Lq = Lk = 127 corner reaches it.
"""
import numpy as np

from zoo import kernel_correct as kernel

BUG = ("under is_causal the partial last key tile of 64 compares the tile-local key index with the row, so for "
       "Lk > 64 with Lk % 64 >= 2 rows in that tile attend keys right of the causal diagonal.")
SOURCE = "zoo extra: an independently written NumPy port of a Triton FlashAttention-2 forward (2026-11-27)"
EXPECTED_CLAUSES = frozenset({"causal.top-left", "sdpa.any-length"})
DTYPES = kernel.DTYPES


def tail_local_bias(mask, is_causal, b, hq, lq, lk):
    bias = kernel.attention_bias(mask, is_causal, b, hq, lq, lk)
    tail = lk - lk % kernel.TILE if lk > kernel.TILE and lk % kernel.TILE else lk
    if not is_causal or tail == lk:
        return bias
    # Rows of a query block of 64 that reaches the tail tile (rows >= tail: the key loop stops at a block's last
    # row) compare the tail keys' local offsets 0..Lk-tail-1 with their row index, so they keep every tail key.
    rows, keys = np.arange(lq)[:, None], np.arange(lk)[None, :]
    wrongly_kept = (rows >= tail) & (keys >= tail) & (keys > rows)  # BUG
    base = kernel.attention_bias(mask, False, b, hq, lq, lk)
    return np.where(wrongly_kept, base, bias)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return kernel.flash_forward(q, k, v, mask, is_causal, scale, bias_fn=tail_local_bias)

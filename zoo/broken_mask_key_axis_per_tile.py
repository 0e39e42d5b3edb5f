"""Broken: a blocked kernel that slices its mask per key tile, so a mask whose key axis is 1 is lost past tile 0.

Key tiles of 64 as ``kernel_correct`` visits them; each tile reads ``mask[..., start:stop]`` and a tile whose
slice is empty counts as "nothing masked here". A mask of shape (..., Lq, 1) (padded queries: every key of a
row masked or none) broadcasts over the keys, but its slice is empty from key 64 on: there a padded row attends
its keys and gets a value instead of the fully masked row's zeros. Exact for every other mask shape, for Lk <= 64
and for rows the mask keeps. A finite float mask of key axis 1 (no row empty) cannot show it; the fully-masked-rows
property's padded-query mask (B, 1, Lq, 1) at Lq 64, Lk 129 does.
"""
import numpy as np

from zoo import kernel_correct as kernel

BUG = ("the mask is sliced per key tile of 64 and an empty slice means no mask, so a mask whose key axis is 1 "
       "masks keys 0..63 only: a padded query row past Lk 64 attends the rest.")
SOURCE = "zoo extra: an independently written NumPy tiled kernel that slices its mask per key tile (2026-11-27)"
EXPECTED_CLAUSES = frozenset({"mask.fully-masked-row"})
DTYPES = kernel.DTYPES


def per_tile_bias(mask, is_causal, b, hq, lq, lk):
    bias = kernel.attention_bias(mask, is_causal, b, hq, lq, lk)
    if mask is None or np.shape(mask)[-1] != 1 or lk <= kernel.TILE:
        return bias
    unmasked = kernel.attention_bias(None, is_causal, b, hq, lq, lk)
    return np.where(np.arange(lk) < kernel.TILE, bias, unmasked)  # BUG: past tile 0 the empty slice masks nothing


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return kernel.flash_forward(q, k, v, mask, is_causal, scale, bias_fn=per_tile_bias)

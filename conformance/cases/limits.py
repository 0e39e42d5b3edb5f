"""The case space's sizes: the caps that keep each example cheap and shrinking readable, the tile edges and the
kernel-shaped sizes (head dims, lengths past blocks, decode caches, GQA groups) and the score budget of a case.
"""
from __future__ import annotations

from hypothesis import strategies as st

MAX_BATCH = 2


MAX_KV_HEADS = 2


MAX_GROUP = 3  # Hq / Hkv


MAX_LEN = 7


MAX_DIM = 6


# Standard deviation of q and k entries; scores then have std about SIGMA**2
# (default scale), so 32 gives scores around 1e3, where exp overflows unless the
# implementation subtracts the row maximum.
SCORE_SIGMAS = {"unit": 1.0, "moderate": 4.0, "large": 32.0}


MASK_KINDS = ("none", "bool-full", "bool-2d", "key-padding", "per-head", "bool-query-keys", "bool-3d-per-head",
              "bool-3d-shared", "float", "float-large", "float-3d")


# Lengths and head widths one short of, at and one past the tile sizes blocked kernels use
# (flash-attention's own tests sweep such pairs: seqlens (113, 203), (1023, 1024), widths 59, 111):
# a partial last tile that is dropped, read twice or masked wrongly shows here (and in the
# kernel-shaped cases below; the small ones stay below 8).
TILE_SIZES = (8, 16, 32, 64, 128)


TILE_EDGE_LENGTHS = st.sampled_from(sorted({t + d for t in TILE_SIZES for d in (-1, 0, 1)})) | st.integers(1, 130)


TILE_EDGE_DIMS = st.sampled_from([7, 8, 9, 15, 16, 17, 31, 33]) | st.integers(1, MAX_DIM)


# Kernel-shaped cases (the shapes flash, cuDNN, flex and Pallas kernels run): head dims 16..256,
# the common ones first (Hypothesis shrinks towards the front of a sampled list); lengths one short
# of, at and one past the 64/128-multiples kernels tile by, up to 2k keys for decode (Lq 1); GQA
# groups up to 8. One case holds at most KERNEL_SCORE_BUDGET scores (B * Hq * Lq * Lk) so that the
# float64 oracle stays in milliseconds; realistic sizes beyond it are --large-shapes.
KERNEL_HEAD_DIMS = (64, 128, 80, 96, 256, 16, 32, 48, 112, 160, 192, 224, 40, 72, 24, 8)


KERNEL_EDGE_LENGTHS = tuple(sorted({t + d for t in (64, 128, 192, 256, 512, 1024, 2048) for d in (-1, 0, 1)}))


KERNEL_SMALL_LENGTHS = (1, 2, 3, 5, 8, 16, 17, 31, 32, 33)


KERNEL_GROUPS = (1, 2, 4, 8, 3, 5, 6, 7)


# The decode property's long caches, past the 4096 and 8192 keys a split-KV kernel may cap its splits at (a
# decode kernel whose splits stopped at key 4096 passed three default runs when caches ended at 2049): its
# long_cache covering corner takes the shortest past DECODE_CORNER_PAST that fits COVERING_SCORE_BUDGET, with head
# dims of at most DECODE_CORNER_MAX_DK (jax_numpy took 79 ms a call at Lk 4097, Dk 256, 17 ms at Dk 16, 259 ms at
# Lk 8193; a judged case 40-60 ms at Dk 64), its random draws those within their budget.
DECODE_CACHE_LENGTHS = (4095, 4096, 4097, 8191, 8192, 8193)


DECODE_CORNER_PAST = 4096


DECODE_CORNER_MAX_DK = 64


KERNEL_SCORE_BUDGET = 2**15


# Implementations that take the small shapes draw a kernel-shaped case one time in KERNEL_SHARE.
KERNEL_SHARE = 5


# A query of 1 (decode), a few (speculative decode), or as many as the keys (prefill) or any (cross).
KERNEL_QUERY_MODES = ("prefill", "decode", "cross")


SCALES = st.one_of(
    st.none(),
    st.sampled_from([0.0, 1.0, -1.0, 0.125, -0.35, 2.5]),
    st.floats(-3, 3, allow_nan=False, allow_infinity=False, width=32),
)

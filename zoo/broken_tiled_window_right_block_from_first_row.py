"""Broken: a compiling tiled kernel (query blocks of 64, key blocks of 128) ends each query block's key loop at the key
block holding its first row's right window edge, so without is_causal the rows further down the block lose the keys
their own right edge reaches in the next key block.

An independently written compiled JAX flash kernel did so. As a compiling implementation it meets few small corners
(lengths up to 7, one key block), which cannot show it; its variant properties run their second brief corner past a
query block with a right edge of 33 keys (covering.COMPILED_WINDOW_CORNER: 129 queries, 192 keys). It takes no
query_offset, whose pairwise corners (an offset of 65 before 64 queries) show the bug too.
"""
import numpy as np

from zoo import _reference as ref
from zoo import correct_variants_reference as variants

BUG = ("the key loop of the query block starting at row r ends with the key block of key r + right, the block's first "
       "row's right edge, instead of its last row's: rows whose right edge reaches the next key block lose its keys.")
SOURCE = "an independently written compiled JAX flash kernel (query blocks of 64, key blocks of 128), 2026-11-28"
EXPECTED_CLAUSES = frozenset({"sdpa.window", "sdpa.variant-order"})
DTYPES = ("float64", "float32")
COMPILED = True  # judged as a kernel under a compiler is: a compile per input signature, few examples
QUERY_BLOCK, KEY_BLOCK = 64, 128


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None):
    query_offset = 0
    ref.check_qkv(q, k, v)
    k_rep, v_rep = ref.expand_kv(ref.as64(k), ref.as64(v), q.shape[1])
    lq, lk = q.shape[-2], k.shape[-2]
    scale = ref.default_scale(q.shape[-1]) if scale is None else float(scale)
    scores = (ref.as64(q) @ np.swapaxes(k_rep, -1, -2)) * scale + ref.mask_bias(mask)
    keep = np.ones((lq, lk), dtype=bool)
    if is_causal:
        keep &= variants.causal_keep(lq, lk, int(query_offset))
    if window is not None:
        keep &= variants.window_keep(lq, lk, window, int(query_offset))
        if window[1] is not None and not is_causal:
            first_row = np.arange(lq)[:, None] // QUERY_BLOCK * QUERY_BLOCK + int(query_offset)
            loop_end = ((first_row + window[1]) // KEY_BLOCK + 1) * KEY_BLOCK  # BUG: the block's first row's edge
            keep &= np.arange(lk)[None, :] < loop_end
    scores = np.where(keep, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = ref.masked_softmax(scores, axis=-1)
    return (weights @ v_rep).astype(ref.out_dtype(q))

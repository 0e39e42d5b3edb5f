"""Broken: a compiling tiled kernel (blocks of 16) ends each query block's causal key loop at a bound computed from
query_offset floored to its block, so with query_offset % 16 != 0 the last key block a row reaches is skipped.

An independently written Pallas kernel (``interpret=True``) did so. As a compiling implementation it meets few small
corners (lengths up to 7, no key past 16), which cannot show it, and Hypothesis's simplest case; its variant and
query-offset properties run their first brief corner past a query block (129 queries, 192 keys, an offset of 31 there).
"""
import numpy as np

from zoo import _reference as ref

BUG = ("the causal key loop of the query block starting at row r ends at key (offset // 16) * 16 + r + 15 instead of "
       "offset + r + 15: rows whose band reaches the last key block lose its keys when offset % 16 != 0.")
SOURCE = "an independently written Pallas flash kernel, blocks of 16, under interpret=True (2026-11-27)"
EXPECTED_CLAUSES = frozenset({"sdpa.query-offset", "sdpa.variant-order"})
DTYPES = ("float64", "float32")
COMPILED = True  # judged as a kernel under a compiler is: a compile per input signature, few examples
BLOCK = 16


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, query_offset=0):
    ref.check_qkv(q, k, v)
    k_rep, v_rep = ref.expand_kv(ref.as64(k), ref.as64(v), q.shape[1])
    lq, lk = q.shape[-2], k.shape[-2]
    scale = ref.default_scale(q.shape[-1]) if scale is None else float(scale)
    scores = (ref.as64(q) @ np.swapaxes(k_rep, -1, -2)) * scale + ref.mask_bias(mask)
    rows, keys = np.arange(lq)[:, None], np.arange(lk)[None, :]
    if is_causal:
        first_row = rows // BLOCK * BLOCK
        loop_end = (int(query_offset) // BLOCK * BLOCK) + first_row + BLOCK - 1  # BUG: the offset floored
        keep = (keys <= int(query_offset) + rows) & (keys <= loop_end)
        scores = np.where(keep, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = ref.masked_softmax(scores, axis=-1)
    return (weights @ v_rep).astype(ref.out_dtype(q))

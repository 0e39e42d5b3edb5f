"""Broken kernel stand-in: under is_causal with Lq > Lk the key loop runs past the last key block.

A flash kernel visits, for query block i, the key blocks up to the causal diagonal, (i + 1) * Bq / Bk
of them. With Lq > Lk that bound passes the number of key blocks, and a kernel that does not clamp
it loads a block beyond the keys: out-of-bounds loads are NaN padding in Pallas's interpret mode
(garbage on a GPU), so every row of such a query block is NaN. Found in JAX's Pallas GPU flash kernel
(``jax.experimental.pallas.ops.gpu.attention.mha``, ``interpret=True``) inside its own declared region;
a default run of 78 random cases had never drawn causal Lq > Lk there. Identical to
``kernel_correct_pallas_region`` otherwise.
"""
import numpy as np

from zoo import kernel_correct_pallas_region as region

BUG = ("is_causal with Lq > Lk: the causal key loop of query block i visits (i + 1) key blocks without "
       "clamping to the number of key blocks, so query blocks past the last key block read out-of-bounds "
       "keys and give NaN rows.")
SOURCE = "JAX Pallas GPU flash kernel (jax.experimental.pallas.ops.gpu.attention.mha), found in interpret mode"
EXPECTED_CLAUSES = frozenset({"sdpa.finite"})
DTYPES = region.DTYPES
SUPPORTS = region.SUPPORTS


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    out = region.sdpa(q, k, v, mask, is_causal, scale)
    lq, lk = q.shape[-2], k.shape[-2]
    key_blocks = -(-lk // region.BLOCK)
    if is_causal and lq > lk:
        rows = np.arange(lq) // region.BLOCK >= key_blocks  # BUG: the loop bound (i + 1) was not clamped
        out = np.where(rows[:, None], np.nan, out).astype(out.dtype)
    return out

"""Broken: a rank-3 mask is read as (B, Lq, Lk) instead of broadcast from the right as (Hq, Lq, Lk)."""
import numpy as np

from zoo import _reference as ref

BUG = "a 3-D mask is given a head axis (mask[:, None]) so its first axis indexes the batch, not the heads."
SOURCE = "an independently written implementation; NumPy/torch broadcasting aligns a 3-D mask from the right"
EXPECTED_CLAUSES = frozenset({"mask.broadcast"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    if mask is not None and np.ndim(mask) == 3:
        mask = np.asarray(mask)[:, None]  # BUG: should be mask[None] (aligned from the right)
        b, hq = np.shape(q)[:2]
        if mask.shape[0] not in (1, b):
            raise ValueError(f"a 3-D mask of {mask.shape[0]} batches for a batch of {b}")
    return ref.sdpa(q, k, v, mask, is_causal, scale)

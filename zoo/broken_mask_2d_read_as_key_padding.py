"""Broken: a 2-D boolean mask whose first axis equals the batch is read as (B, Lk) key padding."""
import numpy as np

from zoo import _reference as ref

BUG = ("a 2-D mask of shape (B, Lk) is taken as one key-padding row per batch entry, Hugging Face's attention_mask "
       "form, instead of (Lq, Lk) broadcast over the batch: wrong where B = Lq and the mask's rows differ.")
SOURCE = ("zoo extra: an independently written wrapper (2026-11-28) that default runs rejected in 1 of 3 (B = Lq >= 2 "
          "with a 2-D mask is rarely drawn); the fixture mask-2d-is-queries-by-keys-when-batch-equals-queries")
EXPECTED_CLAUSES = frozenset({"mask.broadcast", "mask.bool-true-attends"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    if mask is not None and np.ndim(mask) == 2 and np.shape(mask)[0] == np.shape(q)[0]:
        mask = np.asarray(mask)[:, None, None, :]  # BUG: (Lq, Lk) read as (B, Lk)
    return ref.sdpa(q, k, v, mask, is_causal, scale)

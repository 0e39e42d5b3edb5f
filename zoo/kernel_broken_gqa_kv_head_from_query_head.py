"""Broken kernel stand-in: the kv head is indexed by the query head (no GQA mapping), clamped into range.

A kernel written for Hq = Hkv reads k and v at the query head's index. Passed fewer kv heads, a
Pallas BlockSpec index map or an XLA dynamic slice clamps that index into range instead of failing,
so query head h reads kv head min(h, Hkv - 1): right when Hkv = 1 and when Hkv = Hq, silently wrong
(errors of about 0.4) when 1 < Hkv < Hq. Found in JAX's Pallas GPU flash kernel passed fewer kv heads.
Identical to ``kernel_correct_pallas_region`` otherwise.
"""
import numpy as np

from zoo import kernel_correct_pallas_region as region

BUG = ("query head h reads kv head min(h, Hkv - 1) (the query head's own index, clamped) instead of "
       "h // (Hq / Hkv): wrong whenever 1 < Hkv < Hq.")
SOURCE = "JAX Pallas GPU flash kernel (jax.experimental.pallas.ops.gpu.attention.mha) passed fewer kv heads"
EXPECTED_CLAUSES = frozenset({"sdpa.gqa-mapping"})
DTYPES = region.DTYPES
SUPPORTS = region.SUPPORTS


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    hq, hkv = q.shape[1], k.shape[1]
    heads = np.minimum(np.arange(hq), hkv - 1)  # BUG: should be np.arange(hq) // (hq // hkv)
    return region.sdpa(q, k[:, heads], v[:, heads], mask, is_causal, scale)

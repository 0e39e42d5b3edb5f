"""Broken: a split-KV decode path caps the number of splits at 32 but keeps the split size at 128, so keys past
4096 are never visited."""
import math

import numpy as np

from zoo import _reference as ref

BUG = ("for Lq <= 4 against more than 128 keys, the keys are cut into splits of 128 combined by their log-sum-exp "
       "(flash-decoding), the number of splits capped at 32 without growing the split: keys past 4096 are dropped.")
SOURCE = "zoo extra: an independently written split-KV decode kernel (2026-11-24); caches of 2049 keys or fewer pass it"
EXPECTED_CLAUSES = frozenset({"sdpa.definition", "sdpa.cross-attention"})
SPLIT, MAX_SPLITS = 128, 32


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    lq, lk = np.shape(q)[-2], np.shape(k)[-2]
    if lq > 4 or lk <= SPLIT or is_causal:
        return ref.sdpa(q, k, v, mask, is_causal, scale)
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    scale = ref.default_scale(q64.shape[-1]) if scale is None else scale
    scores = scale * (q64 @ np.swapaxes(k64, -1, -2)) + ref.build_bias(mask, False, lq, lk)
    # BUG: the split stays SPLIT keys when the cap bites
    outputs, lses = ref.split_partials(scores, v64, SPLIT, min(math.ceil(lk / SPLIT), MAX_SPLITS))
    lse = np.stack(lses)
    top = np.max(lse, axis=0)
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(lse - top)
    total = weights.sum(0)
    weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return (weights * np.stack(outputs)).sum(0).astype(ref.out_dtype(q))

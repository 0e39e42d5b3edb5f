"""Broken: a split-KV decode path combines its splits by exp(lse_i) without subtracting the largest lse first."""
import math

import numpy as np

from zoo import _reference as ref

BUG = ("for Lq <= 4 against more than 128 keys, the keys are cut into splits of 128 whose partial outputs are "
       "weighted by exp(lse_i), in the accumulator's float32 as a kernel keeps it, without subtracting the largest "
       "lse: once a split's log-sum-exp passes about 88.7 the weights are inf and the output NaN.")
SOURCE = ("zoo extra: an independently written torch decode kernel (2026-11-27); without the long cache of the "
          "decode property's large-score corner, 1 or 2 of about 1950 cases a run reject it, in 16 bits only")
EXPECTED_CLAUSES = frozenset({"sdpa.finite", "sdpa.definition", "sdpa.cross-attention"})
SPLIT = 128


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    lq, lk = np.shape(q)[-2], np.shape(k)[-2]
    if lq > 4 or lk <= SPLIT or is_causal:
        return ref.sdpa(q, k, v, mask, is_causal, scale)
    accumulator = np.float64 if np.asarray(q).dtype == np.float64 else np.float32
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    scale = ref.default_scale(q64.shape[-1]) if scale is None else scale
    scores = scale * (q64 @ np.swapaxes(k64, -1, -2)) + ref.build_bias(mask, False, lq, lk)
    outputs, lses = ref.split_partials(scores, v64, SPLIT, math.ceil(lk / SPLIT))
    with np.errstate(over="ignore", invalid="ignore"):
        weights = np.exp(np.stack(lses).astype(accumulator))  # BUG: exp(lse - max lse), as the splits' max is
        total = weights.sum(0)
        weights = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
        return (weights * np.stack(outputs)).sum(0).astype(ref.out_dtype(q))

"""Correct: a learnable sink applied after the attention, by the log-sum-exp identity of split-KV kernels.

With Z_i = sum_j exp(s_ij) (lse_i = log Z_i) the sink's normaliser is Z_i + exp(sigma_h), so the output with the sink
is the plain output times Z_i / (Z_i + exp(sigma_h)) = sigmoid(lse_i - sigma_h): what FlashAttention's combine step
and MagiAttention's sink correction compute from the (output, lse) a kernel returns. A row without keys has
lse = -inf and gives 0. Independent of the oracle's formula (which puts the sink in the softmax).
"""
from __future__ import annotations

import numpy as np

from zoo import _reference as ref

BUG = "none"
SOURCE = "spec/clauses.yaml sdpa.learnable-sink; flash_attn/cute (lse returned with the output), MagiAttention sink correction"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32")


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, learnable_sink=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    hq = q64.shape[1]
    out = ref.attention64(q64, k64, v64, mask, is_causal, scale)
    if learnable_sink is None:
        return out.astype(ref.out_dtype(q))
    k64, _ = ref.expand_kv(k64, v64, hq)
    scale = ref.default_scale(q64.shape[-1]) if scale is None else float(scale)
    s = (q64 @ np.swapaxes(k64, -1, -2)) * scale + ref.build_bias(mask, is_causal, q64.shape[2], k64.shape[2])
    top = np.max(s, axis=-1, keepdims=True)
    finite = np.isfinite(top)
    with np.errstate(divide="ignore"):
        lse = np.where(finite, np.log(np.sum(np.exp(s - np.where(finite, top, 0.0)), axis=-1, keepdims=True))
                       + np.where(finite, top, 0.0), -np.inf)
    sink = ref.as64(learnable_sink).reshape(1, hq, 1, 1)
    return (out * (1.0 / (1.0 + np.exp(sink - lse)))).astype(ref.out_dtype(q))

"""Broken: the attention softmax runs over the query axis (-2)."""
import numpy as np

from zoo import _reference as ref

BUG = "sdpa normalises the scores with softmax over axis -2 (queries) instead of -1 (keys)."
SOURCE = ("003_58636e0047490b73.txt, 'Scaled Dot-Product Attention': "
          "F.softmax(scores, dim=-2) printed as the mistake")
EXPECTED_CLAUSES = frozenset({"sdpa.definition"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.build_bias(mask, is_causal, q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-2)  # BUG
    return (weights @ v64).astype(ref.out_dtype(q))

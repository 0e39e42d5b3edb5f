"""Broken: returns the float64 working array, whatever q's dtype."""
import numpy as np

from zoo import _reference as ref

BUG = "sdpa returns its float64 result without casting back, so float32 input gives float64 output."
SOURCE = "known bug class (output dtype must equal q's dtype)"
EXPECTED_CLAUSES = frozenset({"sdpa.output-dtype"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.build_bias(mask, is_causal, q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return weights @ v64  # BUG: missing .astype(q.dtype)

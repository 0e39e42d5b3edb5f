"""Broken: sdpa whose attention softmax does not subtract the row maximum."""
import numpy as np

from zoo import _reference as ref
from zoo.broken_softmax_no_max_sub import naive_softmax

BUG = ("sdpa's softmax computes exp(scores) without subtracting the row maximum, "
       "so scores of about 1e3 overflow exp and the output is NaN.")
SOURCE = "known bug class (torch.softmax and jax.nn.softmax subtract the maximum)"
EXPECTED_CLAUSES = frozenset({"softmax.large-inputs"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.build_bias(mask, is_causal, q64.shape[-2], k64.shape[-2])
    weights = naive_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)  # BUG
    return (weights @ v64).astype(ref.out_dtype(q))

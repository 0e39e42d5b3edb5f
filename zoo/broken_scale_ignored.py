"""Broken: an explicit scale is ignored; 1/sqrt(Dk) is always used."""
import numpy as np

from zoo import _reference as ref

BUG = "sdpa ignores its scale argument and always multiplies the scores by 1/sqrt(Dk)."
SOURCE = "known bug class (explicit scale: torch SDPA / jax.nn.dot_product_attention `scale`)"
EXPECTED_CLAUSES = frozenset({"sdpa.scale-explicit"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    scale = ref.default_scale(q64.shape[-1])  # BUG: explicit scale discarded
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.build_bias(mask, is_causal, q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

"""Broken: with scale=None the scores are not scaled at all (scale 1)."""
import numpy as np

from zoo import _reference as ref

BUG = "sdpa with scale=None uses scale 1 (no 1/sqrt(Dk)); an explicit scale is still honoured."
SOURCE = ("004_c2f71d5cd411389d.txt, 'Multi-Head Attention', In [72]: "
          "einsum scores without the retrieval_dims**-0.5 factor used in the single-head cell")
EXPECTED_CLAUSES = frozenset({"sdpa.scale-default"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = 1.0  # BUG: should be 1/sqrt(Dk)
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.build_bias(mask, is_causal, q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

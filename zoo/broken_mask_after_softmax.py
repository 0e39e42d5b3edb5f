"""Broken: the mask multiplies the softmax weights instead of biasing the scores."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa applies the explicit mask after the softmax (weights * mask, i.e. "
       "weights * exp(bias): 1 keep / 0 drop) and does not renormalise, so the "
       "weights of a masked row no longer sum to 1.")
SOURCE = ("known bug class; 002_0d44a559eab251ab.txt 'Applying a Causal Attention Mask' "
          "insists on 'before the softmax operation'")
EXPECTED_CLAUSES = frozenset({"mask.before-softmax"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.build_bias(None, is_causal, q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    weights = weights * np.exp(ref.mask_bias(mask))  # BUG: mask after softmax, no renormalisation
    return (weights @ v64).astype(ref.out_dtype(q))

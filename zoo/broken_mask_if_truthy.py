"""Broken: `if mask: scores += mask`, literally as the document wrote it."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa tests the mask with `if mask:` and then adds it to the scores: a NumPy "
       "mask of more than one element raises ValueError (ambiguous truth value), a "
       "one-element mask is used only if truthy, and a bool mask is added as 0/1 "
       "instead of being applied as keep/drop.")
SOURCE = ("001_b3ba44c054c44630.txt, In [38] scaled_dot_product: "
          "'if mask: scaled += mask'")
EXPECTED_CLAUSES = frozenset({"mask.float-additive", "mask.bool-true-attends"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    if mask:  # BUG: truth value of an array; bool masks get added as 0/1
        scores += mask
    bias = ref.build_bias(None, is_causal, q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

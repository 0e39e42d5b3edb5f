"""Broken: masked scores filled with -1e9, so fully masked rows give the mean of v."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa fills masked scores with the finite value -1e9 (masked_fill) instead of "
       "-inf, so a fully masked row becomes a uniform softmax and yields the mean of v, "
       "while the member does not declare FULLY_MASKED_ROWS = 'uniform'.")
SOURCE = ("003_58636e0047490b73.txt, In [1] dot_product_attention: "
          "scores = scores.masked_fill(mask == 0, -1e9)")
EXPECTED_CLAUSES = frozenset({"mask.fully-masked-row"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    keep, float_bias = True, 0.0
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype == np.bool_:
            keep = m
        else:
            float_bias = ref.as64(m)
    if is_causal:
        keep = keep & ref.causal_keep(q64.shape[-2], k64.shape[-2])
    keep = np.broadcast_to(keep, scores.shape)
    scores = np.where(keep, scores + float_bias, -1e9)  # BUG: masked_fill(-1e9), not -inf
    weights = ref.masked_softmax(scores, axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

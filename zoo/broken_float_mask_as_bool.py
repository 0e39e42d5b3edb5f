"""Broken: a float mask is read as boolean (mask != 0 means attend)."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa turns a float mask into a boolean one with mask != 0 (nonzero = attend) "
       "instead of adding it to the scores: 0 entries are dropped, -inf and other "
       "nonzero entries are attended with no bias.")
SOURCE = "known bug class (float masks are additive: torch SDPA attn_mask)"
EXPECTED_CLAUSES = frozenset({"mask.float-additive"})


def mask_bias(mask):
    if mask is None:
        return np.zeros(())
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        m = m != 0  # BUG: float mask should be added as is
    return np.where(m, 0.0, -np.inf)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = mask_bias(mask)
    if is_causal:
        bias = bias + ref.causal_bias(q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

"""Broken: boolean masks are read with True = masked out."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa reads a boolean mask with True = 'masked out' (the convention of "
       "torch.nn.MultiheadAttention key_padding_mask), the opposite of the contract.")
SOURCE = ("known bug class; 002_0d44a559eab251ab.txt CausalAttention "
          "(masked_fill_(self.mask.bool(), -inf): True means masked there)")
EXPECTED_CLAUSES = frozenset({"mask.bool-true-attends"})


def mask_bias(mask):
    if mask is None:
        return np.zeros(())
    m = np.asarray(mask)
    if m.dtype == np.bool_:
        return np.where(m, -np.inf, 0.0)  # BUG: True should attend (0.0)
    return ref.as64(m)


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

"""Broken: causal bias built as triu(ones, 1) * -inf (0 * -inf = NaN)."""
import numpy as np

from zoo import _reference as ref

BUG = ("is_causal builds its bias as np.triu(np.ones((Lq, Lk)), 1) * -np.inf; "
       "0 * -inf is NaN, so every causal row becomes NaN.")
SOURCE = ("002_0d44a559eab251ab.txt, 'Applying a Causal Attention Mask', step 2: "
          "mask = torch.triu(torch.ones(seq_len, seq_len), diagonal=1) * float('-inf')")
EXPECTED_CLAUSES = frozenset({"sdpa.finite"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.mask_bias(mask)
    with np.errstate(invalid="ignore"):
        if not is_causal:
            weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
            return (weights @ v64).astype(ref.out_dtype(q))
        lq, lk = q64.shape[-2], k64.shape[-2]
        z = scores + bias + np.triu(np.ones((lq, lk)), 1) * -np.inf  # BUG: 0 * -inf = NaN
        # torch.softmax, as in the document: a NaN anywhere in a row makes the whole row NaN.
        e = np.exp(z - np.max(z, axis=-1, keepdims=True))
        return ((e / np.sum(e, axis=-1, keepdims=True)) @ v64).astype(ref.out_dtype(q))

"""Broken: the output buffer is allocated like q, assuming Dv == Dk."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa allocates its output with np.empty_like(q) and writes weights @ v into it, "
       "so Dv != Dk fails to broadcast (or, for Dv = 1, is smeared over Dk columns).")
SOURCE = "zoo extra: output allocated with q's shape"
EXPECTED_CLAUSES = frozenset({"sdpa.value-dim", "sdpa.output-shape"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = ref.expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.build_bias(mask, is_causal, q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    out = np.empty_like(q64)  # BUG: shape (B, Hq, Lq, Dk), not Dv
    out[...] = weights @ v64
    return out.astype(ref.out_dtype(q))

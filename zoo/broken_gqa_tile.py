"""Broken: GQA kv heads tiled (head h uses kv head h % Hkv)."""
import numpy as np

from zoo import _reference as ref

BUG = ("sdpa expands the kv heads with np.tile, so query head h uses kv head "
       "h % Hkv instead of h // (Hq // Hkv) (repeat_interleave).")
SOURCE = "known bug class (torch SDPA enable_gqa uses repeat_interleave)"
EXPECTED_CLAUSES = frozenset({"sdpa.gqa-mapping"})


def expand_kv(k, v, hq):
    hkv = k.shape[1]
    if hkv != v.shape[1] or hkv == 0 or hq % hkv:
        raise ValueError(f"Hkv={hkv} must divide Hq={hq}")
    g = hq // hkv
    return np.tile(k, (1, g, 1, 1)), np.tile(v, (1, g, 1, 1))  # BUG: should be np.repeat(axis=1)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    ref.check_qkv(q64, k64, v64)
    k64, v64 = expand_kv(k64, v64, q64.shape[1])
    if scale is None:
        scale = ref.default_scale(q64.shape[-1])
    scores = (q64 @ np.swapaxes(k64, -1, -2)) * float(scale)
    bias = ref.build_bias(mask, is_causal, q64.shape[-2], k64.shape[-2])
    weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v64).astype(ref.out_dtype(q))

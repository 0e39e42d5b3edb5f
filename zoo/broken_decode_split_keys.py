"""Broken: a decode path (Lq == 1) splits the keys into chunks of 64 and averages the chunks' outputs."""
import numpy as np

from zoo import _reference as ref

BUG = ("for one query (decode) the keys are split into chunks of 64 (split-KV / flash-decoding) and the chunk "
       "outputs are averaged instead of weighted by each chunk's softmax mass: wrong when Lk > 64.")
SOURCE = "an independently written implementation; flash-decoding combines chunks by their log-sum-exp"
EXPECTED_CLAUSES = ref.SDPA_VALUE_CLAUSES
CHUNK = 64


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    lq, lk = np.shape(q)[-2], np.shape(k)[-2]
    if lq != 1 or lk <= CHUNK:
        return ref.sdpa(q, k, v, mask, is_causal, scale)
    mask = None if mask is None else np.broadcast_to(mask, np.shape(mask)[:-2] + (lq, lk))
    outputs = []
    for start in range(0, lk, CHUNK):
        keys = slice(start, start + CHUNK)
        part_mask = None if mask is None else mask[..., keys]
        if is_causal:  # the only query is query 0: it attends key 0 alone
            if start:
                continue
            part_mask = ref.causal_keep(lq, min(CHUNK, lk)) if part_mask is None else (
                part_mask & ref.causal_keep(lq, min(CHUNK, lk)) if part_mask.dtype == np.bool_
                else part_mask + ref.causal_bias(lq, min(CHUNK, lk)))
        outputs.append(ref.attention64(ref.as64(q), ref.as64(np.asarray(k)[..., keys, :]),
                                       ref.as64(np.asarray(v)[..., keys, :]), part_mask, False,
                                       ref.default_scale(np.shape(q)[-1]) if scale is None else scale))
    return np.mean(outputs, axis=0).astype(ref.out_dtype(q))  # BUG: chunks need their softmax mass as weights

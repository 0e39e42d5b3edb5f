"""Broken: q @ k^T is rounded to float16 before the scale, as Hugging Face's eager attention computes it.

``attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling``: with one outlier channel of q and k
(LLM.int8(); massive activations) the unscaled product passes 65504 and becomes inf, and the softmax NaN, while the
scaled score lies inside float16's range. Everything else is the reference's float64 math.
"""
import numpy as np

from zoo import _reference as ref

BUG = "q @ k^T rounded to the input dtype (float16) before the scale: an outlier channel overflows it to inf"
SOURCE = "Hugging Face transformers' eager_attention_forward (q @ k^T, then * scaling)"
EXPECTED_CLAUSES = frozenset({"sdpa.score-range"})
DTYPES = ("float16",)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    ref.check_qkv(q, k, v)
    k_rep, v_rep = ref.expand_kv(ref.as64(k), ref.as64(v), q.shape[1])
    scale = ref.default_scale(q.shape[-1]) if scale is None else float(scale)
    with np.errstate(over="ignore"):
        product = (ref.as64(q) @ np.swapaxes(k_rep, -1, -2)).astype(q.dtype)  # BUG: rounded before the scale
    scores = product.astype(np.float64) * scale
    bias = ref.build_bias(mask, is_causal, q.shape[-2], k.shape[-2])
    with np.errstate(invalid="ignore"):
        weights = ref.masked_softmax(scores + np.broadcast_to(bias, scores.shape), axis=-1)
    return (weights @ v_rep).astype(ref.out_dtype(q))

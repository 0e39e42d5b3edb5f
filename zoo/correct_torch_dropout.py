"""Correct: torch sdpa with attention dropout (ARRAY = "torch"), plain torch ops.

Like correct_torch, plus ``dropout_p``: after the softmax each weight is kept with
probability 1 - p (a Bernoulli draw from torch's global generator) and the kept
ones are divided by 1 - p (inverted dropout), as torch's SDPA reference code does
with torch.dropout(attn_weight, dropout_p, train=True). dropout_p = 0 draws
nothing and is exactly sdpa without dropout.
"""
import math

import torch

from zoo import correct_torch

BUG = "none"
SOURCE = "torch.nn.functional.scaled_dot_product_attention reference code (dropout on the attention weights)"
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"


def attention_weights(q, k, v, mask=None, is_causal=False, scale=None):
    """softmax(q k^T scale + bias) and v with its kv heads repeated to Hq: the weights dropout acts on."""
    hq, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or hq % hkv or v.shape[1] != hkv:
        raise ValueError("incompatible q/k/v shapes")
    k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if is_causal:
        band = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~band, float("-inf"))
    return correct_torch.softmax(scores), v  # fully masked rows: 0, and no NaN in their gradients


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0):
    weights, v = attention_weights(q, k, v, mask, is_causal, scale)
    if dropout_p > 0:
        keep = torch.rand(weights.shape, device=weights.device) >= dropout_p
        weights = weights * keep / (1.0 - dropout_p)
    return weights @ v

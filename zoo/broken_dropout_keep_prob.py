"""Broken: attention dropout that drops with probability 1 - p instead of p (ARRAY = "torch").

A copy of correct_torch_dropout with one line changed (# BUG): dropout_p is used as
the keep probability, while kept weights are still divided by 1 - p.
"""
import math

import torch

BUG = ("sdpa keeps each attention weight with probability dropout_p (drops with 1 - p) instead of dropping with "
       "probability dropout_p; kept weights are scaled by 1/(1-p), so every value looks right but the rate is wrong.")
SOURCE = "zoo extra: keep-probability / drop-probability mix-up (TensorFlow 1 tf.nn.dropout took keep_prob)"
EXPECTED_CLAUSES = frozenset({"dropout.rate"})
ARRAY = "torch"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0):
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
    weights = torch.softmax(scores, dim=-1)
    weights = weights.masked_fill(torch.isneginf(scores).all(dim=-1, keepdim=True), 0.0)  # fully masked rows
    if dropout_p > 0:
        keep = torch.rand(weights.shape, device=weights.device) < dropout_p  # BUG: should be >= dropout_p
        weights = weights * keep / (1.0 - dropout_p)
    return weights @ v

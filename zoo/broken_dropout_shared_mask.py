"""Broken: attention dropout with one random mask shared by every batch element and head (ARRAY = "torch").

A copy of correct_torch_dropout with one line changed (# BUG): the keep mask is
drawn with shape (Lq, Lk) and broadcast, so every (batch, head) slice drops the
same weights. Its overall rate and its scaling are right.
"""
import math

import torch

BUG = ("sdpa draws its dropout keep mask with shape (Lq, Lk) and broadcasts it over batch and heads, so all "
       "(batch, head) slices drop the same weights instead of independent ones.")
SOURCE = "zoo extra: a dropout mask sized from the last two dimensions of the weights only"
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
        keep = torch.rand(weights.shape[-2:], device=weights.device) >= dropout_p  # BUG: weights.shape
        weights = weights * keep / (1.0 - dropout_p)
    return weights @ v

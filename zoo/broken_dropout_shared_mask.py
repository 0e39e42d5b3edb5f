"""Broken: attention dropout with one random mask shared by every batch element and head (ARRAY = "torch").

correct_torch_dropout's weights with its dropout line changed (# BUG): the keep mask is
drawn with shape (Lq, Lk) and broadcast, so every (batch, head) slice drops the
same weights. Its overall rate and its scaling are right.
"""
import torch

from zoo.correct_torch_dropout import attention_weights

BUG = ("sdpa draws its dropout keep mask with shape (Lq, Lk) and broadcasts it over batch and heads, so all "
       "(batch, head) slices drop the same weights instead of independent ones.")
SOURCE = "zoo extra: a dropout mask sized from the last two dimensions of the weights only"
EXPECTED_CLAUSES = frozenset({"dropout.rate"})
ARRAY = "torch"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0):
    weights, v = attention_weights(q, k, v, mask, is_causal, scale)
    if dropout_p > 0:
        keep = torch.rand(weights.shape[-2:], device=weights.device) >= dropout_p  # BUG: weights.shape
        weights = weights * keep / (1.0 - dropout_p)
    return weights @ v

"""Broken: attention dropout that zeroes weights but never rescales the kept ones (ARRAY = "torch").

correct_torch_dropout's weights with its dropout line changed (# BUG): kept weights stay
as they are, so the expected value of the output shrinks by (1 - p).
"""
import torch

from zoo.correct_torch_dropout import attention_weights

BUG = ("sdpa applies dropout to the attention weights (Bernoulli keep with probability 1 - p) but never divides "
       "the kept weights by 1 - p, so training-time outputs shrink by a factor 1 - p.")
SOURCE = "zoo extra: dropout written as weights * keep, the non-inverted form (torch.nn.Dropout scales by 1/(1-p))"
EXPECTED_CLAUSES = frozenset({"dropout.scaling"})
ARRAY = "torch"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0):
    weights, v = attention_weights(q, k, v, mask, is_causal, scale)
    if dropout_p > 0:
        keep = torch.rand(weights.shape, device=weights.device) >= dropout_p
        weights = weights * keep  # BUG: should be weights * keep / (1.0 - dropout_p)
    return weights @ v

"""Broken: attention dropout that drops with probability 1 - p instead of p (ARRAY = "torch").

correct_torch_dropout's weights with its dropout line changed (# BUG): dropout_p is used as
the keep probability, while kept weights are still divided by 1 - p.
"""
import torch

from zoo.correct_torch_dropout import attention_weights

BUG = ("sdpa keeps each attention weight with probability dropout_p (drops with 1 - p) instead of dropping with "
       "probability dropout_p; kept weights are scaled by 1/(1-p), so every value looks right but the rate is wrong.")
SOURCE = "zoo extra: keep-probability / drop-probability mix-up (TensorFlow 1 tf.nn.dropout took keep_prob)"
EXPECTED_CLAUSES = frozenset({"dropout.rate"})
ARRAY = "torch"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0):
    weights, v = attention_weights(q, k, v, mask, is_causal, scale)
    if dropout_p > 0:
        keep = torch.rand(weights.shape, device=weights.device) < dropout_p  # BUG: should be >= dropout_p
        weights = weights * keep / (1.0 - dropout_p)
    return weights @ v

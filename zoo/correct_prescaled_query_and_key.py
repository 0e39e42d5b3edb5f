"""Correct: q and k each scaled by sqrt(scale) in the input dtype before the product, as OpenAI's guided-diffusion
and improved-diffusion QKVAttention do ("more stable with f16 than dividing afterwards"); then correct_torch's sdpa
with scale 1.

Both roundings move a score: by up to u sqrt|scale| |q_d| sqrt|scale| |k_d| per term and per operand. Where an
operand's entries share a significand (repeated values, or values a power of two apart) their roundings are the same
relative error, so they add linearly within that group, not as a random walk: bfloat16 q = (16, 45, 90, 180, 5, 9,
10, 18) was 1.6x over the allowance before spec/tolerances.yaml's c_operand counted groups and the key's rounding.
"""
import math

import torch

from zoo import correct_torch

BUG = "none"
SOURCE = "zoo extra: openai/guided-diffusion QKVAttentionLegacy (q * scale, k * scale with scale = ch ** -0.25)"
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float64", "float32", "float16", "bfloat16")


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q, k = torch.as_tensor(q), torch.as_tensor(k)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    root = math.sqrt(abs(scale))
    return correct_torch.sdpa(q * (math.copysign(root, scale)), k * root, v, mask, is_causal, scale=1.0)

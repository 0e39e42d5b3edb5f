"""A plain wrapper around torch.nn.functional.scaled_dot_product_attention, as a user first writes it.

It passes a mask and is_causal straight through; torch refuses the two together (torch 2.13 on the CPU: where
Dv != Dk, its math path) and, on the CPU, gives NaN rows for is_causal with scale 0.
`attention-conformance --impl torch_sdpa_wrapper` names both causes, one line each.
"""
import torch

ARRAY = "torch"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                                            enable_gqa=q.shape[1] != k.shape[1])

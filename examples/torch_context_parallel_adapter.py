"""PyTorch's context-parallel ring attention (torch.distributed.tensor.experimental, torch 2.13) on gloo ranks: its
ring, ``_context_parallel._attention._templated_ring_attention(group, seq_dim, op, q, k, v, is_causal)``, with the
CPU flash kernel ``aten._scaled_dot_product_flash_attention_for_cpu`` as the op it runs per step.

The public ``context_parallel()`` context manager cannot run causal attention on the CPU (it registers sharding
strategies for the CUDA flash, efficient and cuDNN ops only: NotImplementedError for the CPU flash op), and without
causality it all-gathers k and v (no ring); so this adapter calls the ring it uses on a GPU, which is private API.
The zigzag layout is its head-tail load balancing (``_cp_options.enable_load_balance``), which it allows with
is_causal only (without causality the layout changes nothing). Its backward is the one context parallelism
registers for the flash op, ``_templated_ring_attention_backward`` (differentiating the forward ring itself hangs
its ranks), which takes the output's gradient only: lse is returned undifferentiated. It takes no window, sink,
scale or kv heads fewer than Hq (repeated here). Measured: docs/real-libraries.md, "Sequence-parallel libraries".
"""
import torch
from torch.distributed.tensor.experimental._context_parallel import _attention as context_parallel

ARRAY = "torch"
DTYPES = ("float32", "float64")
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = {"layouts": ["contiguous", "zigzag"], "uneven_lengths": False, "gradients": True}
SUPPORTS = {"value_head_dim": "same"}  # the CPU flash kernel: "Q/K/V should have the same head size"


def cpu_flash(query, key, value, is_causal=False, **kwargs):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal)[:2]
    return out, lse


def cpu_flash_backward(grad_out, query, key, value, out, logsumexp, is_causal=False, **kwargs):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out,
                                                                                logsumexp, 0.0, is_causal)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, is_causal):
        out, lse = context_parallel._templated_ring_attention(group, 2, cpu_flash, q, k, v, is_causal=is_causal)[:2]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.is_causal = group, is_causal
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        grads = context_parallel._templated_ring_attention_backward(ctx.group, 2, cpu_flash_backward, grad_out,
                                                                    "grad_out", *ctx.saved_tensors, ctx.is_causal)
        return (*grads[:3], None, None)


def sdpa_sequence_parallel(q, k, v, *, group=None, sequence_layout="contiguous", is_causal=False, return_lse=False):
    group = group or torch.distributed.group.WORLD
    heads = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(heads, 1), v.repeat_interleave(heads, 1)
    context_parallel._cp_options.enable_load_balance = bool(is_causal and sequence_layout == "zigzag")
    out, lse = RingAttention.apply(q, k, v, group, bool(is_causal))
    return (out, lse) if return_lse else out

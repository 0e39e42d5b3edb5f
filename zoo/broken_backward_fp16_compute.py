"""Broken: correct float32/float64 forward, backward computed in float16 (ARRAY = "torch")."""
import torch

from zoo.correct_torch_autograd_function import forward_parts, sum_groups

BUG = ("a torch.autograd.Function whose forward computes in the input dtype (right) but whose backward "
       "casts P, Q, K, V and dO to float16, computes the gradients there and casts them back, "
       "so float32 and float64 gradients carry float16 rounding errors (about 2^13 times float32's).")
SOURCE = "known bug class (a float32 backward computed in float16 must fail); mixed-precision backward kernels"
EXPECTED_CLAUSES = frozenset({"grad.sdpa-q", "grad.sdpa-k", "grad.sdpa-v", "grad.mask"})
ARRAY = "torch"


class SDPA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal, scale):
        out, p, k_rep, v_rep, scale, group = forward_parts(q, k, v, mask, is_causal, scale)
        ctx.save_for_backward(q, k_rep, v_rep, p)
        ctx.scale, ctx.group = scale, group
        ctx.mask_shape = None if mask is None or mask.dtype == torch.bool else mask.shape
        return out

    @staticmethod
    def backward(ctx, d_out):
        dtype = d_out.dtype
        # BUG: should compute in the input dtype, not float16
        q, k_rep, v_rep, p, d_out = (t.to(torch.float16) for t in (*ctx.saved_tensors, d_out))
        dv = p.transpose(-2, -1) @ d_out
        dp = d_out @ v_rep.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
        dq = ctx.scale * (ds @ k_rep)
        dk = ctx.scale * (ds.transpose(-2, -1) @ q)
        dmask = ds.sum_to_size(ctx.mask_shape) if ctx.mask_shape is not None and ctx.needs_input_grad[3] else None
        dq, dk, dv = dq.to(dtype), sum_groups(dk, ctx.group).to(dtype), sum_groups(dv, ctx.group).to(dtype)
        return dq, dk, dv, None if dmask is None else dmask.to(dtype), None, None


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return SDPA.apply(q, k, v, mask, is_causal, scale)

"""Broken: correct forward, backward that multiplies the mask gradient by the scale (ARRAY = "torch")."""
import torch

from zoo.correct_torch_autograd_function import forward_parts, sum_groups

BUG = ("a torch.autograd.Function whose forward adds the float mask to the scaled scores (right) but whose "
       "backward returns dMask = scale * dS, as if the mask were scaled together with q k^T.")
SOURCE = "zoo extra: the chain rule of the q k^T * scale term applied to the additive mask too"
EXPECTED_CLAUSES = frozenset({"grad.mask"})
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
        q, k_rep, v_rep, p = ctx.saved_tensors
        dv = p.transpose(-2, -1) @ d_out
        dp = d_out @ v_rep.transpose(-2, -1)
        ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
        dq = ctx.scale * (ds @ k_rep)
        dk = ctx.scale * (ds.transpose(-2, -1) @ q)
        # BUG: should be ds.sum_to_size(ctx.mask_shape), without ctx.scale
        wanted = ctx.mask_shape is not None and ctx.needs_input_grad[3]
        dmask = (ctx.scale * ds).sum_to_size(ctx.mask_shape) if wanted else None
        return dq, sum_groups(dk, ctx.group), sum_groups(dv, ctx.group), dmask, None, None


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return SDPA.apply(q, k, v, mask, is_causal, scale)

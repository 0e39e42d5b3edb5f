"""Broken: correct forward, backward whose dK forgets the scale (ARRAY = "torch")."""
import torch

from zoo.correct_torch_autograd_function import forward_parts, sum_groups

BUG = ("a torch.autograd.Function whose forward is right but whose backward computes dK = dS^T Q "
       "without the factor scale (dQ keeps it), so dk is off by a factor 1/scale (sqrt(Dk) at the default scale).")
SOURCE = "zoo extra: the scale folded into q in the forward and forgotten on the k side of the backward"
EXPECTED_CLAUSES = frozenset({"grad.sdpa-k"})
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
        dk = ds.transpose(-2, -1) @ q  # BUG: should be ctx.scale * (ds.transpose(-2, -1) @ q)
        dmask = ds.sum_to_size(ctx.mask_shape) if ctx.mask_shape is not None and ctx.needs_input_grad[3] else None
        return dq, sum_groups(dk, ctx.group), sum_groups(dv, ctx.group), dmask, None, None


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return SDPA.apply(q, k, v, mask, is_causal, scale)

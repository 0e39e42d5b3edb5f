"""Broken: correct forward, GQA backward that keeps the first query head of each group (ARRAY = "torch")."""
import torch

from zoo.correct_torch_autograd_function import forward_parts

BUG = ("a torch.autograd.Function whose forward is right (kv heads repeat_interleave'd) but whose backward "
       "returns, for each kv head, the dk and dv of the first query head of its group instead of the sum "
       "over the group.")
SOURCE = ("known bug class (GQA: the kv gradients sum over the query heads that share them); "
          "the inverse of repeat_interleave taken as a slice")
EXPECTED_CLAUSES = frozenset({"grad.gqa-sum"})
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
        dmask = ds.sum_to_size(ctx.mask_shape) if ctx.mask_shape is not None and ctx.needs_input_grad[3] else None
        g = ctx.group
        # BUG: should be sum_groups(dk, g), sum_groups(dv, g) (the sum over the group)
        return dq, dk[:, ::g], dv[:, ::g], dmask, None, None


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return SDPA.apply(q, k, v, mask, is_causal, scale)

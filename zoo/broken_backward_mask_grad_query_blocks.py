"""Broken: a backward that runs its queries in blocks of 64 and writes a broadcast mask's gradient per block.

Correct forward (ARRAY = "torch"). The backward computes dS per query block of 64 rows, as a flash backward
does, and stores each block's dMask reduced to the mask's shape. Where the mask's query axis is 1 (a key-padding
mask (B, 1, 1, Lk)) every block writes the same row, and the last block's sum overwrites the others' instead of
adding to them. Exact for Lq <= 64 and for masks with a query axis of Lq. Written blind in a held-out hunt
(stop 45, h11b); it passed a default run whose float-mask gradient corners had at most 7 rows.
"""
import torch

from zoo.correct_torch_autograd_function import forward_parts, sum_groups

BUG = ("the backward runs query blocks of 64 rows and assigns each block's mask gradient, reduced to the mask's "
       "shape, instead of adding it: with a mask whose query axis is 1 and Lq > 64 only the last block's remains.")
SOURCE = "held-out hunt h11b (a torch.autograd.Function with a blocked backward; zoo extra)"
EXPECTED_CLAUSES = frozenset({"grad.mask"})
ARRAY = "torch"
BLOCK_M = 64


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
        dmask = None
        if ctx.mask_shape is not None and ctx.needs_input_grad[3]:
            shape = torch.Size((1,) * (4 - len(ctx.mask_shape)) + tuple(ctx.mask_shape))
            dmask = torch.zeros(shape, dtype=ds.dtype, device=ds.device)
            for start in range(0, ds.shape[-2], BLOCK_M):
                block = ds[..., start:start + BLOCK_M, :]
                rows = slice(start, start + BLOCK_M) if shape[-2] != 1 else slice(0, 1)
                dmask[..., rows, :] = block.sum_to_size(shape[:-2] + (block.shape[-2] if shape[-2] != 1 else 1,
                                                                      shape[-1]))  # BUG: = instead of +=
            dmask = dmask.reshape(ctx.mask_shape)
        return dq, sum_groups(dk, ctx.group), sum_groups(dv, ctx.group), dmask, None, None


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return SDPA.apply(q, k, v, mask, is_causal, scale)

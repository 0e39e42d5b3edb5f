"""Broken: a backward that runs its queries in blocks of 64 and writes a broadcast mask's gradient per block.

Correct forward (ARRAY = "torch"). The backward computes dS per query block of 64 rows, as a flash backward
does, and stores each block's dMask reduced to the mask's shape. Where the mask's query axis is 1 (a key-padding
mask (B, 1, 1, Lk)) every block writes the same row, and the last block's sum overwrites the others' instead of
adding to them. Exact for Lq <= 64 and for masks with a query axis of Lq: the float-mask gradient
property's kernel-shaped corner past a query block (Lq 129, Lk 128, a key-padding mask) reaches it.
"""
import torch

from zoo import correct_torch_autograd_function as correct

BUG = ("the backward runs query blocks of 64 rows and assigns each block's mask gradient, reduced to the mask's "
       "shape, instead of adding it: with a mask whose query axis is 1 and Lq > 64 only the last block's remains.")
SOURCE = "zoo extra: an independently written torch.autograd.Function with a blocked backward (2026-11-27)"
EXPECTED_CLAUSES = frozenset({"grad.mask"})
ARRAY = "torch"
BLOCK_M = 64


def blocked_mask_gradient(ds, mask_shape):
    """dMask from dS, one query block of BLOCK_M rows at a time."""
    shape = torch.Size((1,) * (4 - len(mask_shape)) + tuple(mask_shape))
    dmask = torch.zeros(shape, dtype=ds.dtype, device=ds.device)
    for start in range(0, ds.shape[-2], BLOCK_M):
        block = ds[..., start:start + BLOCK_M, :]
        if shape[-2] == 1:
            dmask[...] = block.sum_to_size(shape)  # BUG: = instead of +=, the last block's sum overwrites the rest
        else:
            dmask[..., start:start + BLOCK_M, :] = block.sum_to_size(shape[:-2] + block.shape[-2:])
    return dmask.reshape(mask_shape)


class SDPA(correct.SDPA):
    """The correct Function, its mask gradient replaced by the blocked one."""

    @staticmethod
    def backward(ctx, d_out):
        return correct.gradients(ctx, d_out, *ctx.saved_tensors, mask_gradient=blocked_mask_gradient)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return SDPA.apply(q, k, v, mask, is_causal, scale)

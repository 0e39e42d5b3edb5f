"""Broken: correct forward (zeros on a row without keys), backward that turns a float mask's -inf row into NaN.

The forward guards rows left without keys (P = 0, output 0), as ``correct_torch_autograd_function`` does; the
backward recomputes P from the scores without that guard where a float mask removed every key (only the
boolean mask and the causal band were thought of): exp(-inf - (-inf)) is NaN, and the row's NaN reaches dq,
dk, dv and dMask even where its upstream gradient is 0. Exact wherever every row keeps a key, so only
gradient cases with a row without keys reach it (the float-mask gradient property draws them, dO 0 there).
"""
import torch

from zoo import correct_torch_autograd_function as correct

BUG = ("the backward recomputes P without the forward's guard, so a row a float mask sets to -inf on every key "
       "gives NaN gradients (0/0), dq, dk, dv and dMask alike.")
SOURCE = ("zoo extra: an independently written torch.autograd.Function whose backward guards bool and causal rows "
          "only (2026-11-27)")
EXPECTED_CLAUSES = frozenset({"grad.mask", "grad.sdpa-q", "grad.sdpa-k", "grad.sdpa-v"})
ARRAY = "torch"


class SDPA(correct.SDPA):
    """The correct Function; its backward's P unguarded on rows a float mask empties."""

    @staticmethod
    def backward(ctx, d_out):
        q, k_rep, v_rep, p = ctx.saved_tensors
        if ctx.mask_shape is not None:
            empty = (p.sum(dim=-1, keepdim=True) == 0)  # BUG: these rows' P recomputed as 0/0
            p = torch.where(empty, torch.full_like(p, float("nan")), p)
        return correct.gradients(ctx, d_out, q, k_rep, v_rep, p)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return SDPA.apply(q, k, v, mask, is_causal, scale)

"""Correct: sdpa as a torch.autograd.Function with a hand-written backward (ARRAY = "torch").

The forward is plain torch ops in the input dtype (GQA by repeat_interleave, bool
mask by masked_fill, float mask added, top-left causal band, fully masked rows
zero). The backward is the analytic one, written out:

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),
    dQ = scale dS K,  dK = scale dS^T Q,  dMask = dS (summed to the mask's shape),

with dK and dV summed over the query heads sharing each kv head. The
broken_backward_* members reuse ``forward_parts`` and change one line of
``backward`` (marked # BUG there).
"""
import math

import torch

BUG = "none"
SOURCE = "torch.autograd.Function docs (custom forward/backward); the softmax Jacobian diag(p) - p p^T"
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float64", "float32", "float16", "bfloat16")


def forward_parts(q, k, v, mask, is_causal, scale):
    """(out, p, k_rep, v_rep, scale, group): the forward and what the backward needs."""
    hq, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or hq % hkv or v.shape[1] != hkv:
        raise ValueError("incompatible q/k/v shapes")
    group = hq // hkv
    k_rep, v_rep = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = (q * scale) @ k_rep.transpose(-2, -1)  # q scaled first: q @ k^T may pass float16's range
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(s.dtype)
    if is_causal:
        band = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~band, float("-inf"))
    row_max = s.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    e = torch.exp(s - row_max)
    total = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(total == 0, torch.ones_like(total), total)  # a fully masked row: all zeros
    return p @ v_rep, p, k_rep, v_rep, scale, group


def sum_groups(x, group):
    """(B, Hq, ...) -> (B, Hkv, ...): the sum over the query heads sharing each kv head."""
    b, hq = x.shape[:2]
    return x.reshape(b, hq // group, group, *x.shape[2:]).sum(dim=2)


class SDPA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal, scale):
        with torch.no_grad():
            out, p, k_rep, v_rep, scale, group = forward_parts(q, k, v, mask, is_causal, scale)
        ctx.save_for_backward(q, k_rep, v_rep, p)
        ctx.scale, ctx.group = scale, group
        ctx.mask_shape = None if mask is None or mask.dtype == torch.bool else mask.shape
        return out

    @staticmethod
    def backward(ctx, d_out):
        return gradients(ctx, d_out, *ctx.saved_tensors)


def gradients(ctx, d_out, q, k_rep, v_rep, p, mask_gradient=lambda ds, shape: ds.sum_to_size(shape)):
    """SDPA.backward's result from the saved tensors (a broken member may hand other ones, or its own
    ``mask_gradient(dS, mask shape)``)."""
    dv = p.transpose(-2, -1) @ d_out
    dp = d_out @ v_rep.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    dq = ctx.scale * (ds @ k_rep)
    dk = ctx.scale * (ds.transpose(-2, -1) @ q)
    dmask = mask_gradient(ds, ctx.mask_shape) if ctx.mask_shape is not None and ctx.needs_input_grad[3] else None
    return dq, sum_groups(dk, ctx.group), sum_groups(dv, ctx.group), dmask, None, None


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return SDPA.apply(q, k, v, mask, is_causal, scale)

"""Correct: sdpa with every variant keyword as a torch.autograd.Function with a hand-written backward.

The forward is torch ops in the input dtype: scale q.k, softcap, ALiBi, the float mask, the keys the causal band,
the window (with its sink tokens), the chunk, the key lengths and the left padding keep (a boolean key set built
with the sink, chunk and left-padding reference's position steps, zoo/correct_sink_chunk_leftpad_reference.py),
softmax with the learnable sink in the normaliser, @ v. The backward recomputes the weights from the saved inputs,
as flash kernels do, and applies the analytic gradients of docs/gradients.md:

    dV = P^T dO,  dP = dO V^T,  r = rowsum(dP * P),  dS = P * (dP - r),
    dT = dS * (1 - (S_cap / c)^2) under softcap (dS otherwise),  dQ = scale dT K,  dK = scale dT^T Q,
    dMask = dS (summed to the mask's shape),  dsink = -sum_b sum_i P_sink r,

dK and dV summed over the query heads of a group. The broken_backward_* variant members change one class attribute
of ``VariantSDPA`` (marked # BUG there).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from zoo import correct_sink_chunk_leftpad_reference as steps
from zoo import correct_variants_reference as variants

BUG = "none"
SOURCE = ("torch.autograd.Function docs (custom forward/backward); docs/gradients.md (the variants' gradients); "
          "FlashAttention's backward recomputes P with the forward's masking and multiplies dS by the softcap's "
          "derivative; FlashAttention 4 returns dsink")
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float64", "float32", "float16", "bfloat16")


def key_set(lq: int, lk: int, is_causal, window, query_offset, key_lengths, sink_token_length,
            attention_chunk, key_leftpad) -> np.ndarray:
    """(B or 1, 1, lq, lk) boolean: the keys every removal leaves (structure: NumPy on the host)."""
    leftpad = None if key_leftpad is None else key_leftpad.cpu().numpy()
    query, key = steps.positions(lq, lk, query_offset, leftpad)
    keep = np.ones(np.broadcast_shapes(query.shape, key.shape), dtype=bool)
    if is_causal:
        keep = keep & steps.causal_keep(query, key)
    if window is not None:
        keep = keep & steps.window_keep(query, key, window, sink_token_length)
    if attention_chunk is not None:
        keep = keep & steps.chunk_keep(query, key, attention_chunk)
    if key_leftpad is not None:
        keep = keep & steps.leftpad_keep(key)
    if key_lengths is not None:
        keep = keep & variants.length_keep(key_lengths.cpu().numpy(), lk)
    return keep


def sum_groups(x, group: int):
    """(B, Hq, ...) -> (B, Hkv, ...): the sum over the query heads sharing each kv head."""
    b, hq = x.shape[:2]
    return x.reshape(b, hq // group, group, *x.shape[2:]).sum(dim=2)


def softmax_with_sink(s, sink_column):
    """(P, P_sink or None): the softmax of the masked scores ``s`` over its last axis, with the learnable sink's
    logit (broadcast against ``s[..., :1]``) as one more column; a row without keys and without a sink is all zeros."""
    row_max = s.amax(dim=-1, keepdim=True) if s.shape[-1] else torch.full(s.shape[:-1] + (1,), float("-inf"),
                                                                           dtype=s.dtype, device=s.device)
    if sink_column is not None:
        column = sink_column.to(s.dtype)
        row_max = torch.maximum(row_max, column)
    row_max = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    e = torch.exp(s - row_max)
    total = e.sum(dim=-1, keepdim=True)
    p_sink = None
    if sink_column is not None:
        own = torch.exp(column - row_max)
        total = total + own
        p_sink = own / total
    return e / torch.where(total == 0, torch.ones_like(total), total), p_sink


class VariantSDPA(torch.autograd.Function):
    # What the backward does; each broken member changes one of these.
    SOFTCAP_DERIVATIVE = True  # dT = dS * (1 - (S_cap / c)^2)
    SINK_SIGN = -1.0  # dsink = SINK_SIGN * sum P_sink r
    SINK_GRADIENT = True  # return dsink at all
    BACKWARD_KEEPS_WINDOW = True  # the recomputed weights remove the window's keys too

    @staticmethod
    def weights(q, k, mask, sink, options, keep_window=True):
        """(P, P_sink or None, S_cap or None, k_rep, scale, group): the forward's weights, recomputed on demand."""
        (is_causal, scale, window, softcap, alibi_slopes, query_offset, key_lengths, sink_token_length,
         attention_chunk, key_leftpad) = options
        hq, hkv = q.shape[1], k.shape[1]
        group = hq // hkv
        k_rep = k.repeat_interleave(group, dim=1)
        lq, lk = q.shape[2], k.shape[2]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        s = (q * scale) @ k_rep.transpose(-2, -1)  # q scaled first: q @ k^T may pass float16's range
        capped = None
        if softcap is not None:
            capped = torch.tanh(s / softcap) * softcap
            s = capped
        if alibi_slopes is not None:
            bias = variants.alibi(alibi_slopes.cpu().numpy(), hq, lq, lk, query_offset)
            s = s + torch.from_numpy(bias).to(device=s.device, dtype=s.dtype)
        if mask is not None and mask.dtype != torch.bool:
            s = s + mask.to(s.dtype)
        keep = torch.from_numpy(np.ascontiguousarray(key_set(
            lq, lk, is_causal, window if keep_window else None, query_offset, key_lengths,
            sink_token_length, attention_chunk, key_leftpad))).to(s.device)
        if mask is not None and mask.dtype == torch.bool:
            keep = keep & mask
        s = s.masked_fill(~keep, float("-inf"))
        p, p_sink = softmax_with_sink(s, None if sink is None else sink.reshape(1, hq, 1, 1))
        return p, p_sink, capped, k_rep, scale, group

    @classmethod
    def forward(cls, ctx, q, k, v, mask, sink, options):
        with torch.no_grad():
            p, _, _, _, _, group = cls.weights(q, k, mask, sink, options)
            out = p @ v.repeat_interleave(group, dim=1)
        ctx.save_for_backward(q, k, v, mask if mask is not None and mask.dtype != torch.bool else None, sink)
        ctx.bool_mask = mask if mask is not None and mask.dtype == torch.bool else None
        ctx.options = options
        return out

    @classmethod
    def backward(cls, ctx, d_out):
        q, k, v, float_mask, sink = ctx.saved_tensors
        mask = float_mask if float_mask is not None else ctx.bool_mask
        with torch.no_grad():
            p, p_sink, capped, k_rep, scale, group = cls.weights(q, k, mask, sink, ctx.options,
                                                                 keep_window=cls.BACKWARD_KEEPS_WINDOW)
            v_rep = v.repeat_interleave(group, dim=1)
            dv = p.transpose(-2, -1) @ d_out
            dp = d_out @ v_rep.transpose(-2, -1)
            row = (dp * p).sum(dim=-1, keepdim=True)
            ds = p * (dp - row)
            dt = ds
            softcap = ctx.options[3]
            if capped is not None and cls.SOFTCAP_DERIVATIVE:
                dt = ds * (1 - (capped / softcap) ** 2)
            dq = scale * (dt @ k_rep)
            dk = scale * (dt.transpose(-2, -1) @ q)
            dmask = ds.sum_to_size(float_mask.shape) if float_mask is not None and ctx.needs_input_grad[3] else None
            dsink = None
            if sink is not None and cls.SINK_GRADIENT and ctx.needs_input_grad[4]:
                dsink = (cls.SINK_SIGN * (p_sink * row).sum(dim=(0, 2, 3))).to(sink.dtype)
        return dq, sum_groups(dk, group), sum_groups(dv, group), dmask, dsink, None


def call(function, q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None,
         alibi_slopes=None, query_offset=0, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    """``function`` (VariantSDPA or a broken member's subclass) applied to the contract's arguments."""
    options = (bool(is_causal), scale, None if window is None else tuple(window), softcap, alibi_slopes,
               int(query_offset), key_lengths, int(sink_token_length), attention_chunk, key_leftpad)
    return function.apply(q, k, v, mask, learnable_sink, options)


def sdpa_of(function):
    """The contract's sdpa (every variant keyword in its signature) around ``function`` (VariantSDPA or a broken
    member's subclass)."""

    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None):
        # query_lengths only marks padding rows, which the contract leaves unspecified: every row is computed.
        return call(function, q, k, v, mask, is_causal, scale, window=window, softcap=softcap,
                    alibi_slopes=alibi_slopes, query_offset=query_offset, key_lengths=key_lengths,
                    learnable_sink=learnable_sink, sink_token_length=sink_token_length,
                    attention_chunk=attention_chunk, key_leftpad=key_leftpad)

    return sdpa


sdpa = sdpa_of(VariantSDPA)

"""Correct: sdpa_varlen as a torch.autograd.Function with a hand-written backward (ARRAY = "torch").

The forward is torch ops in the input dtype over the whole packed batch, as a varlen kernel computes it: the scores
of every packed query against every packed key, a document mask keeping key j for query i only when both belong to
the same sequence (its keys past seqused_k removed), each sequence's causal band and window at its bottom-right
positions, softcap, ALiBi (per sequence slopes), the learnable sink in the normaliser, @ v. The backward recomputes
the weights from the saved inputs and the same mask, as FlashAttention's varlen backward does, and applies the
analytic gradients of docs/gradients.md over the packed rows:

    dV = P^T dO,  dP = dO V^T,  r = rowsum(dP * P),  dS = P * (dP - r),  dT = dS * (1 - (S_cap / c)^2) (softcap),
    dQ = scale dT K,  dK = scale dT^T Q,  dsink = -sum_i P_sink r,

dK and dV summed over the query heads of a group. The broken varlen backward members change one class attribute of
``VarlenSDPA`` (marked # BUG there).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from zoo import correct_varlen_paged_reference as steps
from zoo.correct_torch_variant_backward import softmax_with_sink

BUG = "none"
SOURCE = ("torch.autograd.Function docs (custom forward/backward); docs/gradients.md (the packed batch's gradients, "
          "sequence by sequence); FlashAttention's varlen backward recomputes P under the forward's masking")
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float64", "float32", "float16", "bfloat16")


def packed_structure(cu_seqlens_q, cu_seqlens_k, seqused_k, is_causal, window, leak: bool = False):
    """(keep (total_q, total_k) boolean, distance (total_q, total_k), query sequence (total_q,)): which packed key
    each packed query attends and their position distance (ALiBi), bottom-right in each sequence. ``leak``: a query
    also keeps the keys of the sequence before its own (the broken member's backward)."""
    cq, ck = (np.asarray(x.cpu() if hasattr(x, "cpu") else x).astype(np.int64) for x in (cu_seqlens_q, cu_seqlens_k))
    used = None if seqused_k is None else np.asarray(seqused_k.cpu() if hasattr(seqused_k, "cpu") else seqused_k)
    spans = steps.spans(cq, ck, used)
    keep = np.zeros((int(cq[-1]), int(ck[-1])), dtype=bool)
    distance = np.zeros(keep.shape)
    query_seq = np.zeros(keep.shape[0], dtype=np.int64)
    for b, (qs, qe, ks, ke) in enumerate(spans):
        lq, lk = qe - qs, ke - ks
        positions = steps.query_positions(lq, lk, "bottom-right")
        keep[qs:qe, ks:ke] = steps.keep_keys(positions, lk, is_causal, window)
        distance[qs:qe, ks:ke] = np.abs(positions[:, None] - np.arange(lk)[None, :])
        query_seq[qs:qe] = b
        if leak and b > 0:  # the previous sequence's used keys, at their own positions
            ps, pe = spans[b - 1][2], spans[b - 1][3]
            keep[qs:qe, ps:pe] = True
    return keep, distance, query_seq


class VarlenSDPA(torch.autograd.Function):
    # What the backward does; each broken member changes one of these.
    BACKWARD_LEAKS_TO_NEXT_SEQUENCE = False  # the recomputed weights keep sequence b's keys for sequence b + 1

    @staticmethod
    def weights(q, k, sink, options, leak=False):
        """(P (Hq, total_q, total_k), P_sink (Hq, total_q, 1) or None, S_cap or None, k_rep, scale, group)."""
        cu_q, cu_k, seqused_k, is_causal, scale, window, softcap, alibi_slopes = options
        hq, hkv = q.shape[1], k.shape[1]
        group = hq // hkv
        keep, distance, query_seq = packed_structure(cu_q, cu_k, seqused_k, is_causal, window, leak)
        k_rep = k.repeat_interleave(group, dim=1)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        s = torch.einsum("qhd,khd->hqk", q * scale, k_rep)
        capped = None
        if softcap is not None:
            capped = torch.tanh(s / softcap) * softcap
            s = capped
        if alibi_slopes is not None:
            slopes = alibi_slopes.detach().to(torch.float64).cpu().numpy()
            per_row = slopes[query_seq] if slopes.ndim == 2 else np.broadcast_to(slopes, (len(query_seq), hq))
            bias = -per_row.T[:, :, None] * distance[None]  # (Hq, total_q, total_k)
            s = s + torch.from_numpy(bias).to(device=s.device, dtype=s.dtype)
        s = s.masked_fill(~torch.from_numpy(keep).to(s.device), float("-inf"))
        p, p_sink = softmax_with_sink(s, None if sink is None else sink.reshape(hq, 1, 1))
        return p, p_sink, capped, k_rep, scale, group

    @classmethod
    def forward(cls, ctx, q, k, v, sink, options):
        with torch.no_grad():
            p, _, _, _, _, group = cls.weights(q, k, sink, options)
            out = torch.einsum("hqk,khd->qhd", p, v.repeat_interleave(group, dim=1))
        ctx.save_for_backward(q, k, v, sink)
        ctx.options = options
        return out

    @classmethod
    def backward(cls, ctx, d_out):
        q, k, v, sink = ctx.saved_tensors
        with torch.no_grad():
            p, p_sink, capped, k_rep, scale, group = cls.weights(q, k, sink, ctx.options,
                                                                 leak=cls.BACKWARD_LEAKS_TO_NEXT_SEQUENCE)
            v_rep = v.repeat_interleave(group, dim=1)
            dv = torch.einsum("hqk,qhd->khd", p, d_out)
            dp = torch.einsum("qhd,khd->hqk", d_out, v_rep)
            row = (dp * p).sum(dim=-1, keepdim=True)
            dt = ds = p * (dp - row)
            softcap = ctx.options[6]
            if capped is not None:
                dt = ds * (1 - (capped / softcap) ** 2)
            dq = scale * torch.einsum("hqk,khd->qhd", dt, k_rep)
            dk = scale * torch.einsum("hqk,qhd->khd", dt, q)
            dsink = None
            if sink is not None and ctx.needs_input_grad[3]:
                dsink = (-(p_sink * row).sum(dim=(1, 2))).to(sink.dtype)

        def groups(x):  # (total_k, Hq, D) -> (total_k, Hkv, D): the sum over each kv head's query heads
            return x.reshape(x.shape[0], x.shape[1] // group, group, x.shape[2]).sum(dim=2)

        return dq, groups(dk), groups(dv), dsink, None


def sdpa_varlen_of(function):
    """The contract's sdpa_varlen around ``function`` (VarlenSDPA or a broken member's subclass)."""

    def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                    seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
        options = (cu_seqlens_q, cu_seqlens_k, seqused_k, bool(is_causal), scale,
                   None if window is None else tuple(window), softcap, alibi_slopes)
        return function.apply(q, k, v, learnable_sink, options)

    return sdpa_varlen


sdpa_varlen = sdpa_varlen_of(VarlenSDPA)

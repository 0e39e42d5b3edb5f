"""torch's CPU and default paths: hand-written torch ops (torch_math), scaled_dot_product_attention's own dispatch
(torch_sdpa), nn.MultiheadAttention (torch_nn_mha), and FP8 attention on torch._scaled_mm (torch_scaled_mm_fp8).
"""
from __future__ import annotations

import functools
import math

from attention_conformance.implementations.builtin.common import (
    ALL_DTYPES,
    distance_matrix,
    used_variants,
    head_groups,
    mha_with,
    positions_allowed,
    sink_4d,
    slopes_4d,
)
from attention_conformance.implementations.builtin.cuda_deviations import (
    CUDA_16BIT_KERNEL_DEVIATIONS,
    CUDA_CUDNN_FINITE_MASK_FILL,
    FORWARD_VALUE_CLAUSES,
    GRADIENT_CLAUSES,
)


class TorchMath:
    """Hand-written torch: q scaled, matmul, masked_fill, softmax, matmul, in the input dtype."""

    NAME = "torch_math"
    ARRAY = "torch"
    DTYPES = ALL_DTYPES

    @staticmethod
    def softmax(x, axis=-1):
        import torch

        return torch.softmax(x, dim=axis)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None, return_lse=False):
        import torch

        group = head_groups(q, k)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        lq, lk = q.shape[-2], k.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        # q scaled first (as BART, Whisper and Flax do): q @ k^T of an outlier channel passes float16's range where
        # the scaled score does not (Hugging Face's eager q @ k^T * scaling overflows there).
        scores = (q * scale) @ k.transpose(-1, -2)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if alibi_slopes is not None:
            distance = torch.from_numpy(distance_matrix(lq, lk, query_offset)).to(q.device)
            scores = scores - (slopes_4d(alibi_slopes, q.shape[1]) * distance).to(scores.dtype)
        allowed = torch.from_numpy(positions_allowed(lq, lk, is_causal, window, query_offset, key_lengths,
                                                      sink_token_length=sink_token_length,
                                                      attention_chunk=attention_chunk, key_leftpad=key_leftpad))
        allowed = allowed.to(q.device)
        if mask is not None and mask.dtype == torch.bool:
            allowed = allowed & mask
        elif mask is not None:
            scores = scores + mask
        scores = scores.masked_fill(~allowed, float("-inf"))
        if learnable_sink is not None:
            # gpt-oss's form: the sink is one more column of the scores, its weight dropped before @ v.
            sink = sink_4d(learnable_sink, q.shape[1]).to(scores.dtype).expand(*scores.shape[:-1], 1)
            scores = torch.cat([scores, sink], dim=-1)
            out = torch.softmax(scores, dim=-1)[..., :-1] @ v
        else:
            # A row with no attendable key is 0/0 in softmax; the contract says zeros. Its scores are replaced before
            # the softmax, not only its weights after: a softmax of -inf rows has NaN weights whose backward is NaN
            # (times a zero upstream gradient), which reached dq, dk and a float mask's gradient.
            empty = scores.isneginf().all(-1, keepdim=True)
            out = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0) @ v
        if not return_lse:
            return out
        # torch.logsumexp of a row of -inf is -inf: a row without keys (the sink's column counted where there is one)
        return out, torch.logsumexp(scores.to(torch.float64 if q.dtype == torch.float64 else torch.float32), dim=-1)

    @staticmethod
    def merge_states(out, lse, *, learnable_sink=None):
        """The running update of ring attention over the parts (ring-flash-attention's update_out_and_lse and
        PyTorch's context-parallel merger), in float32, written with the maximum subtracted so that an empty running
        state (lse -inf) takes the next part whole instead of NaN: lse = m + log(e^(lse_a - m) + e^(lse_b - m))."""
        import torch

        acc = torch.float64 if out.dtype == torch.float64 else torch.float32
        merged, merged_lse = out[0].to(acc), lse[0].to(acc)
        parts = [(out[p].to(acc), lse[p].to(acc)) for p in range(1, out.shape[0])]
        if learnable_sink is not None:  # the sink as one more part: no value, its logit as lse
            sink = learnable_sink.to(acc).reshape(1, -1, 1).expand_as(merged_lse)
            parts.append((torch.zeros_like(merged), sink))
        for part, part_lse in parts:
            top = torch.maximum(merged_lse, part_lse)
            top = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
            mine, theirs = torch.exp(merged_lse - top), torch.exp(part_lse - top)
            total = mine + theirs
            found = total > 0
            safe = torch.where(found, total, torch.ones_like(total))
            # a part's value counts only where it weighs something: an empty state's out may hold anything
            kept = mine[..., None] * torch.where(mine[..., None] > 0, merged, 0.0)
            added = theirs[..., None] * torch.where(theirs[..., None] > 0, part, 0.0)
            merged = torch.where(found[..., None], (kept + added) / safe[..., None],
                                 torch.zeros_like(merged))
            merged_lse = torch.where(found, top + torch.log(safe), torch.full_like(top, -torch.inf))
        return merged.to(out.dtype), merged_lse.to(torch.float64 if acc == torch.float64 else torch.float32)

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                             learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
        import torch

        return mha_with(cls.sdpa, query, key, value, params, num_heads, mask, is_causal, torch,
                         **used_variants(window=window, softcap=softcap, alibi_slopes=alibi_slopes, query_offset=query_offset,
                                 key_lengths=key_lengths, learnable_sink=learnable_sink,
                                 sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                                 key_leftpad=key_leftpad))



class TorchSDPA:
    """torch.nn.functional.scaled_dot_product_attention (whichever kernel torch picks)."""

    NAME = "torch_sdpa"
    ARRAY = "torch"
    DTYPES = ALL_DTYPES
    KNOWN_DEVIATIONS = (
        {
            "clause": "sdpa.finite",
            "when": lambda facts: facts["device"] == "cpu" and facts["is_causal"] and facts["mask_kind"] == "none"
            and facts["scale"] is not None and facts["scale"] <= 0,
            "reason": "torch 2.13 CPU: is_causal=True with a scale <= 0 returns NaN from the default (flash) CPU "
            "kernel (it scales the -inf of masked scores: -inf * 0 and -inf * -s); the same causal band as an "
            "explicit mask, and the math backend, give the right result",
        },
        {
            "clause": FORWARD_VALUE_CLAUSES + GRADIENT_CLAUSES,
            "when": lambda facts: facts["device"] == "cpu" and facts["is_causal"] and facts["mask_kind"] == "none"
            and facts["scale"] is not None and facts["scale"] < 0 and facts["dtype"] in ("float16", "bfloat16")
            and facts["Lk"] % 8 == 0,
            "reason": "torch 2.13 CPU, the same kernel with a negative scale in float16/bfloat16: where Lk is a "
            "multiple of 8 the causal rows come out finite and wrong (0, or a mix of the wrong keys) instead of NaN "
            "(measured for Lq 1-9, Lk 1-19: Lk 8 and 16 wrong, the other Lk > 1 NaN); seen by every property that "
            "draws such a case, gradients included",
        },
    ) + CUDA_16BIT_KERNEL_DEVIATIONS + (CUDA_CUDNN_FINITE_MASK_FILL,)

    @staticmethod
    def softmax(x, axis=-1):
        import torch.nn.functional as F

        return F.softmax(x, dim=axis)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0, *, window=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None):
        # No softcap: SDPA has no hook between q.k and the mask, so softcap cases are unsupported. The causal
        # band with an offset, windows and key lengths reach SDPA as its boolean attn_mask, ALiBi as its float
        # attn_mask (the bias plus any float mask): a test of SDPA's mask paths, not of a native variant.
        import torch
        import torch.nn.functional as F

        if window is not None or alibi_slopes is not None or query_offset or key_lengths is not None:
            lq, lk = q.shape[-2], k.shape[-2]
            allowed = torch.from_numpy(positions_allowed(lq, lk, is_causal, window, query_offset, key_lengths))
            allowed = allowed.to(q.device)
            if mask is not None and mask.dtype == torch.bool:
                allowed, mask = allowed & mask, None
            if alibi_slopes is not None:
                distance = torch.from_numpy(distance_matrix(lq, lk, query_offset)).to(q.device)
                bias = -(slopes_4d(alibi_slopes, q.shape[1]) * distance).to(q.dtype)
                mask = bias if mask is None else bias + mask
            mask = allowed if mask is None else torch.where(allowed, mask, float("-inf"))
            is_causal = False
        if is_causal and mask is not None:
            # Some torch kernels refuse attn_mask with is_causal ("Explicit attn_mask should
            # not be set when is_causal=True"); the contract intersects them, so fold the
            # causal band into the mask here.
            band = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            mask = mask & band if mask.dtype == torch.bool else mask.masked_fill(~band, float("-inf"))
            is_causal = False
        if mask is not None and mask.shape[-1] != k.shape[-2]:
            # A mask broadcast along the keys (last dim 1): the memory-efficient CUDA kernel refuses it
            # ("(*bias): last dimension must be contiguous"); the contract allows it, so expand it here.
            mask = mask.expand(*mask.shape[:-1], k.shape[-2]).contiguous()
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None):
        # The variants its sdpa takes (no softcap, no sinks, chunks or left padding: SDPA has no hook for them).
        import torch

        return mha_with(cls.sdpa, query, key, value, params, num_heads, mask, is_causal, torch,
                         **used_variants(window=window, alibi_slopes=alibi_slopes, query_offset=query_offset,
                                 key_lengths=key_lengths))


class TorchMultiheadAttentionModule:
    """torch.nn.MultiheadAttention, its conventions translated to the contract.

    The module stores weights as (out, in) (transposed here), packs q/k/v into
    in_proj_weight when kdim == vdim == E (separate q/k/v_proj_weight otherwise),
    has one bias switch for all projections (absent biases become zeros), and its
    boolean attn_mask means "masked out" (inverted here). It supports only
    H * Dk == H * Dv == E (head width E / H) and an output width E; other
    parameter shapes raise NotImplementedError (unsupported, not failed).
    """

    NAME = "torch_nn_mha"
    ARRAY = "torch"
    DTYPES = ALL_DTYPES
    SUPPORTS = {"mha_head_width": "e_over_h"}  # said, so that generated cases are drawn inside

    @staticmethod
    def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
        import torch

        e, e_kv = query.shape[-1], key.shape[-1]
        w_q, w_k, w_v, w_o = (params[n] for n in ("w_q", "w_k", "w_v", "w_o"))
        if not (w_q.shape[1] == w_k.shape[1] == w_v.shape[1] == e == w_o.shape[0] == w_o.shape[1]):
            raise NotImplementedError("nn.MultiheadAttention needs H*Dk == H*Dv == E and an output width E")
        if key.shape[-1] != value.shape[-1] and e_kv != e:
            raise NotImplementedError("nn.MultiheadAttention needs kdim == vdim here")
        module = torch.nn.MultiheadAttention(
            e, num_heads, bias=True, kdim=e_kv, vdim=e_kv, batch_first=True, dtype=query.dtype, device=query.device
        )

        def bias(name, width):
            b = params.get("b_" + name)
            return torch.zeros(width, dtype=query.dtype, device=query.device) if b is None else b

        # The contract's parameters become the module's for this call (torch.func.functional_call), so that the
        # module's forward runs on them and autograd reaches them (grad.mha), as training's optimizer sees them.
        if module._qkv_same_embed_dim:
            weights = {"in_proj_weight": torch.cat([w_q.T, w_k.T, w_v.T])}
        else:
            weights = {"q_proj_weight": w_q.T, "k_proj_weight": w_k.T, "v_proj_weight": w_v.T}
        weights.update({"in_proj_bias": torch.cat([bias("q", e), bias("k", e), bias("v", e)]),
                        "out_proj.weight": w_o.T, "out_proj.bias": bias("o", e)})
        b, lq, lk = query.shape[0], query.shape[1], key.shape[1]
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=query.device)
        if is_causal:
            allowed = allowed.tril()
        if mask is None or mask.dtype == torch.bool:
            keep = allowed if mask is None else allowed & mask
            # nn.MultiheadAttention: True means "not allowed to attend".
            attn_mask = ~keep.expand(b, num_heads, lq, lk).reshape(b * num_heads, lq, lk)
        else:
            bias_ = mask.masked_fill(~allowed, float("-inf"))
            attn_mask = bias_.expand(b, num_heads, lq, lk).reshape(b * num_heads, lq, lk)
        out, _ = torch.func.functional_call(module, weights, (query, key, value),
                                            {"attn_mask": attn_mask, "need_weights": False})
        return out


# ------------------------------------------------------------------ FP8 attention
@functools.cache
def _scaled_mm_on_cpu() -> bool:
    """Whether this torch's FP8 GEMM runs on the CPU (torch 2.13 does; older builds raise)."""
    import torch

    one = torch.ones((1, 1)).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(one, one, scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0), out_dtype=torch.float32)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


class TorchScaledMMFP8:
    """FP8 attention from torch's FP8 ops, arranged as FlashAttention 3 arranges its forward: per (batch, head),
    S = torch._scaled_mm(q, k^T) of the float8 inputs with q_descale, k_descale as its scales (float32 out; q's
    factor is its kv head's), then the scale, a softcap, the masks, the row maximum m, P = 2^8 e^(s - m) in float32,
    the row sum from that P, P cast to the inputs' float8 format (torch's own rounding), O = torch._scaled_mm(P, v)
    with v_descale as v's scale, O / row sum, bfloat16 out (FP8_OUTPUT_DTYPE). torch._scaled_mm runs on the CPU in
    torch 2.13 (any shape, e4m3fn and e5m2); on CUDA it needs sm89+ and dims in multiples of 16, not measured here:
    CPU only.
    """

    NAME = "torch_scaled_mm_fp8"
    ARRAY = "torch"
    DTYPES = ("float8_e4m3fn", "float8_e5m2")
    DEVICES = ("cpu",)
    FP8_OUTPUT_DTYPE = "bfloat16"
    MAX_OFFSET = 8  # FlashAttention 3's: P in [0, 256] uses more of the 8-bit range than [0, 1]

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
             query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
        # query_lengths only marks padding rows, which the contract does not judge: every row is computed.
        import torch

        if not _scaled_mm_on_cpu():
            raise NotImplementedError(f"torch {torch.__version__}: torch._scaled_mm does not run on the CPU")
        b, hq, lq, _ = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        group = hq // hkv
        one = torch.ones((b, hkv), dtype=torch.float32)
        qd, kd, vd = (one if d is None else d.to(torch.float32) for d in (q_descale, k_descale, v_descale))
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        keep = torch.from_numpy(positions_allowed(lq, lk, is_causal, window, query_offset, key_lengths))
        if mask is not None and mask.dtype == torch.bool:
            keep = keep & mask
        out = torch.zeros((b, hq, lq, v.shape[-1]), dtype=torch.float32)
        for i in range(b):
            for h in range(hq):
                g = h // group
                s = torch._scaled_mm(q[i, h], k[i, g].t(), scale_a=qd[i, g], scale_b=kd[i, g],
                                     out_dtype=torch.float32) * scale
                if softcap is not None:
                    s = torch.tanh(s / softcap) * softcap
                if mask is not None and mask.dtype != torch.bool:
                    s = s + torch.broadcast_to(mask, (b, hq, lq, lk))[i, h]
                s = s.masked_fill(~torch.broadcast_to(keep, (b, hq, lq, lk))[i, h], float("-inf"))
                top = s.amax(dim=-1, keepdim=True)
                top = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
                p = torch.exp(s - top) * 2.0**cls.MAX_OFFSET
                total = p.sum(dim=-1, keepdim=True)
                o = torch._scaled_mm(p.to(v.dtype), v[i, g], scale_a=torch.tensor(1.0), scale_b=vd[i, g],
                                     out_dtype=torch.float32)
                out[i, h] = torch.where(total > 0, o / torch.where(total > 0, total, 1.0), 0.0)
        return out.to(torch.bfloat16)

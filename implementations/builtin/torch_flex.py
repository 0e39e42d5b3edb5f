"""torch's flex_attention: compiled on CUDA (torch_flex) and eager on the CPU (torch_flex_cpu, every variant, packed
batches by document masking and paged caches through torch's PagedAttention).
"""
from __future__ import annotations

from attention_conformance.implementations.builtin.common import (
    host_ints,
    packed_positions,
    per_row_slopes,
    sink_4d,
    slopes_4d,
)


def sink_factor(lse, sink):
    """Z / (Z + e^sigma) from the log-sum-exp lse = log Z and a learnable sink sigma: sigmoid(lse - sigma), each side
    written so that the value and its gradient keep float32's relative accuracy. sigmoid(lse - sigma) alone rounds to
    1 once the sink's weight P = sigmoid(sigma - lse) is below 2^-24, and its backward, y (1 - y) from that rounded y,
    gave dsink = 0 where the analytic one was -2.6e-16 (H200, torch_flex float32, allowed 7e-20). Where lse >= sigma
    this takes 1 - P, whose backward P (1 - P) keeps P's accuracy; a row without keys (lse = -inf) gives 0."""
    import torch

    return torch.where(lse >= sink, 1 - torch.sigmoid(sink - lse), torch.sigmoid(lse - sink))


class TorchFlexAttention:
    """torch.nn.attention.flex_attention compiled with torch.compile (its fused Triton kernel).

    The contract maps onto flex's modifications: a boolean mask and is_causal become a
    BlockMask (mask_mod), a float mask a score_mod adding it. Measured on an H100 (torch
    2.11+cu130): float32 needs head dims >= 16 ("NYI: embedding dimension ... at least
    16"); Dv != Dk, GQA (enable_gqa), scale <= 0 and fully masked rows (zeros) are right.
    CUDA only: on a CPU the compile goes through inductor's C++ backend, seconds per shape.
    """

    NAME = "torch_flex"
    ARRAY = "torch"
    DEVICES = ("cuda",)
    DTYPES = ("float32", "float16", "bfloat16")
    COMPILED = True
    # Head dims up to 128: at 256 (16-bit, 16 workers on an H100, torch 2.11+cu130, 2026-11-27) the forward's launch
    # failed with "CUDA driver error: out of memory" in Triton's static launcher (Lq = Lk = 65, 2 cases) and the
    # compiles of two backwards (softcap, learnable sink; Lq 65, Lk 64) ran past the 120 s call limit, after which 86
    # cases of that worker failed uncalled.
    SUPPORTS = {"head_dims": {"min": 16, "max": 128}}
    _compiled = None
    # H200, torch 2.11+cu130, 16 workers on 16 cores (2026-11-27): compiling the float32 kernel at Dk 256 (Lq = Lk =
    # 65) and at Dk 192 (Lq 1, Lk 256) was still in Triton's make_llir after 85 s and 120 s; in the next run one at
    # Dk 112, Dv 80 (both padded to 128 in the kernel) after 92 s, and float32 properties took 56-117 s a test
    # against 57-111 s for the 16-bit ones. Every float16 and bfloat16 compile returned.
    FLOAT32_MAX_HEAD_DIM = 64
    # Triton refusing a kernel whose tiles need more shared memory than the GPU has (H200, torch 2.11: the float16
    # backward at Dk 128, Dv 192 asked 246784 bytes of 232448): unsupported, as torch's "No available kernel" is.
    REFUSALS = ("out of resource",)

    @classmethod
    def supports(cls, facts):
        # On cuda only: the eager CPU subclass compiles no Triton kernel.
        if facts.get("device") == "cuda" and facts.get("dtype") == "float32" \
                and max(facts["Dk"], facts["Dv"]) > cls.FLOAT32_MAX_HEAD_DIM:
            return (f"float32 at head dims above {cls.FLOAT32_MAX_HEAD_DIM}: its Triton compile ran past 90 s on an "
                    "H200 (torch 2.11)")
        return None

    @classmethod
    def _flex(cls):
        if cls._compiled is None:
            import torch
            from torch.nn.attention.flex_attention import flex_attention

            # Every new input signature recompiles; past dynamo's default limit (8) flex would silently run
            # its unfused eager path, which is not the kernel under test.
            torch._dynamo.config.recompile_limit = 10**6
            torch._dynamo.config.accumulated_recompile_limit = 10**6
            cls._compiled = torch.compile(flex_attention)
        return cls._compiled

    @staticmethod
    def _mods(q, b, hq, lq, lk, *, is_causal, window, softcap, offset, sink_tokens, chunk, keep=None, bias=None,
              lengths=None, slopes=None, pads=None):
        """(mask_mod or None, score_mod or None): the contract's variants as flex's modifications, each present
        only where a case uses it."""
        import torch

        left, right = window if window is not None else (None, None)
        # softcap as a 0-d tensor the score_mod captures, not a Python float: once a second softcap value reaches
        # the compiled flex, dynamo passes the float as an unspecialized scalar, which inductor's flex lowering
        # cannot take (torch 2.11 on an H200 and 2.13 on a CPU: "LoweringException: RuntimeError:
        # unbacked_bindings" from the second value on; a captured tensor compiles once and is reused).
        cap = None if softcap is None else torch.tensor(float(softcap), dtype=torch.float32, device=q.device)
        if is_causal or keep is not None or window is not None or lengths is not None or chunk is not None \
                or pads is not None:
            def mask_mod(bi, h, qi, ki):
                # Positions count from the first real key (sdpa.key-leftpad): key ki at ki - pad, query qi at
                # offset + qi - pad.
                p, j = (qi + offset, ki) if pads is None else (qi + offset - pads[bi], ki - pads[bi])
                allowed = j <= p if is_causal else ki >= 0
                if left is not None:
                    within = j >= p - left
                    allowed = allowed & (within | ((j >= 0) & (j < sink_tokens)) if sink_tokens else within)
                if right is not None:
                    allowed = allowed & (j <= p + right)
                if chunk is not None:
                    allowed = allowed & (torch.div(j, chunk, rounding_mode="floor")
                                         == torch.div(p, chunk, rounding_mode="floor"))
                if pads is not None:
                    allowed = allowed & (j >= 0)
                if lengths is not None:
                    allowed = allowed & (ki < lengths[bi])
                return allowed & keep[bi, h, qi, ki] if keep is not None else allowed
        else:
            mask_mod = None

        if softcap is not None or slopes is not None or bias is not None:
            def score_mod(score, bi, h, qi, ki):
                if cap is not None:
                    score = torch.tanh(score / cap) * cap
                if slopes is not None:
                    score = score - slopes[bi, h] * (qi + offset - ki).abs()
                if bias is not None:
                    score = score + bias[bi, h, qi, ki]
                return score
        else:
            score_mod = None
        return mask_mod, score_mod

    @staticmethod
    def _block_mask(mask_mod, b, h, lq, lk, device):
        """flex's BlockMask of ``mask_mod`` (the kernel skips the blocks it marks empty)."""
        from torch.nn.attention.flex_attention import create_block_mask

        return create_block_mask(mask_mod, b, h, lq, lk, device=device)

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None, return_lse=False):
        # Every variant is flex's own: the causal band (offset), the window with its sink tokens, the chunk, key
        # lengths, the left padding and a boolean mask are one mask_mod (a BlockMask); softcap, ALiBi and a float
        # mask one score_mod, in the contract's order. The learnable sink, which is no key, rescales flex's output
        # by its log-sum-exp: o * Z / (Z + e^sigma) = o * sigmoid(lse - sigma) (a row without keys: lse = -inf, 0;
        # sink_factor).
        import torch

        b, hq, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        options = {}
        if mask is not None and mask.dtype == torch.bool:
            options["keep"] = mask.expand(b, hq, lq, lk).contiguous()
        elif mask is not None:
            options["bias"] = mask.expand(b, hq, lq, lk).contiguous()
        if key_lengths is not None:
            options["lengths"] = key_lengths.to(device=q.device, dtype=torch.int64).reshape(-1).expand(b).contiguous()
        if alibi_slopes is not None:
            options["slopes"] = slopes_4d(alibi_slopes, hq)[..., 0, 0].expand(b, hq).contiguous()
        if key_leftpad is not None:
            options["pads"] = key_leftpad.to(device=q.device, dtype=torch.int64).reshape(-1).expand(b).contiguous()
        mask_mod, score_mod = cls._mods(q, b, hq, lq, lk, is_causal=bool(is_causal), window=window, softcap=softcap,
                                        offset=int(query_offset), sink_tokens=int(sink_token_length),
                                        chunk=attention_chunk, **options)
        block_mask = None if mask_mod is None else cls._block_mask(mask_mod, b, hq, lq, lk, q.device)
        if learnable_sink is None and not return_lse:  # the log-sum-exp only where it is asked or a sink needs it
            return cls._flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                               enable_gqa=hq != k.shape[1])
        try:  # torch >= 2.9 asks for the log-sum-exp as an AuxRequest (return_lse is deprecated there)
            from torch.nn.attention.flex_attention import AuxRequest
        except ImportError:
            out, lse = cls._flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                   enable_gqa=hq != k.shape[1], return_lse=True)
        else:
            out, aux = cls._flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                   enable_gqa=hq != k.shape[1], return_aux=AuxRequest(lse=True))
            lse = aux.lse
        if learnable_sink is not None:
            sink = sink_4d(learnable_sink, hq)[..., 0].to(device=lse.device, dtype=lse.dtype)  # (1, Hq, 1)
            out = (out * sink_factor(lse, sink)[..., None].to(out.dtype)).to(q.dtype)
            lse = torch.logaddexp(lse, sink)  # flex's lse is the keys' alone: the sink's term counted once
        return (out, lse.to(torch.float32)) if return_lse else out


class TorchFlexAttentionCPU(TorchFlexAttention):
    """flex_attention on the CPU, eager (unfused): the framework path that expresses every variant on a CPU.

    Measured on the 2-core CI-like CPU (torch 2.13, benchmarks/variant_probe.py, machine shared): under
    torch.compile the first call of each new shape takes 15-45 s (inductor's C++ backend), then 16-31 ms. Eager, flex
    calls its dense path (torch/_higher_order_ops/flex_attention.py, math_attention: the mods applied to every score)
    with the mods as written, under flex's documented debug switch (_flex below): no dynamo trace. It is marked
    COMPILED all the same: a call of 10-20 ms, against under 1 ms for torch_sdpa on the property shapes, earns a
    compiling implementation's reduced example budget (a tenth; the full default budget took 9 min for this built-in
    alone in float32). It checks flex's semantics (the same mask_mod/score_mod as torch_flex), not its fused kernel.
    float32 only: each dtype adds every fixture again.
    GRADIENTS = False: flex has no backward on the CPU ("FlexAttention does not support backward on CPU",
    torch 2.13), so the gradient tests do not apply to it.
    """

    NAME = "torch_flex_cpu"
    DEVICES = ("cpu",)
    DTYPES = ("float32",)
    COMPILED = True
    GRADIENTS = False
    SUPPORTS = {}

    @classmethod
    def _flex(cls):
        import warnings

        import torch.nn.attention.flex_attention as flex_module

        def eager(*args, **kwargs):
            # Without the switch, eager flex traced each call with dynamo (backend "eager"), once per new structure of
            # its mods (0.2-0.5 s a trace; 13 traces and half of this built-in's 24 s of CPU over its tests in one
            # process, torch 2.13, 2026-11-28). With it, flex calls its dense path directly: the same aten ops on the
            # same tensors, so what is judged does not change (all 596 distinct calls of those tests, sdpa, varlen,
            # paged and the log-sum-exp, bit for bit the same both ways). Scoped to this call; a torch without the
            # switch traces as before.
            switch = getattr(flex_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", False)
            flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
            try:
                with warnings.catch_warnings():
                    # "flex_attention called without torch.compile()": intended here (see the class docstring).
                    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
                    return flex_module.flex_attention(*args, **kwargs)
            finally:
                flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = switch

        return eager

    @staticmethod
    def _block_mask(mask_mod, b, h, lq, lk, device, block: int = 128):
        """Every block partial: flex's dense CPU path (torch/_higher_order_ops/flex_attention.py math_attention)
        reads only the BlockMask's mask_mod, applied to every score, so the result is the same as with
        create_block_mask's (checked bit for bit), whose vmapped mask_mod over every score cost 10-80 ms a call."""
        import torch
        from torch.nn.attention.flex_attention import BlockMask

        nq, nk, h = -(-lq // block), -(-lk // block), h or 1
        counts = torch.full((b, h, nq), nk, dtype=torch.int32, device=device)
        indices = torch.arange(nk, dtype=torch.int32, device=device).expand(b, h, nq, nk).contiguous()
        return BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(lq, lk))

    @classmethod
    def sdpa(cls, q, k, v, *args, **kwargs):
        # Refused up front (GRADIENTS = False keeps the suite from asking): flex raises its own error only after
        # a whole forward.
        if any(t.requires_grad for t in (q, k, v)):
            raise NotImplementedError("flex_attention has no backward on the CPU (torch 2.13)")
        return super().sdpa(q, k, v, *args, **kwargs)

    # Packed and paged batches, in flex's own idioms: document masking for sdpa_varlen (a mask_mod keeping
    # a key only for a query of the same sequence, on per-row sequence ids and positions), and torch's PagedAttention
    # for sdpa_paged (torch/nn/attention/experimental/_paged_attention.py: a logical BlockMask converted to the
    # physical pages of the cache, whose mask_mod and score_mod map each physical key back to its logical position
    # and mask the slots past seqused_k).
    @staticmethod
    def _keep(allowed, p, j, is_causal, window):
        """``allowed`` where query position p also keeps key position j (tensors) by the causal band and the window."""
        if is_causal:
            allowed = allowed & (j <= p)
        left, right = window if window is not None else (None, None)
        if left is not None:
            allowed = allowed & (j >= p - int(left))
        if right is not None:
            allowed = allowed & (j <= p + int(right))
        return allowed

    @staticmethod
    def _capped(score, cap):
        """softcap's cap * tanh(score / cap); ``cap`` a 0-d tensor of the score's dtype, or None."""
        import torch

        return score if cap is None else torch.tanh(score / cap) * cap

    @classmethod
    def _with_sink(cls, q, k, v, block_mask, score_mod, scale, learnable_sink, hq: int):
        """flex's output, rescaled by its log-sum-exp for a learnable sink as the sdpa path does."""

        kwargs = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=hq != k.shape[1])
        if learnable_sink is None:
            return cls._flex()(q, k, v, **kwargs)
        from torch.nn.attention.flex_attention import AuxRequest

        out, aux = cls._flex()(q, k, v, return_aux=AuxRequest(lse=True), **kwargs)
        sink = sink_4d(learnable_sink, hq)[..., 0].to(device=aux.lse.device, dtype=aux.lse.dtype)
        return (out * sink_factor(aux.lse, sink)[..., None].to(out.dtype)).to(q.dtype)

    @classmethod
    def sdpa_varlen(cls, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                    scale=None, *, seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
        import torch

        device, hq = q.device, q.shape[1]
        rows = [torch.as_tensor(x, device=device) for x in packed_positions(cu_seqlens_q, cu_seqlens_k, seqused_k)]
        query_seq, query_position, key_seq, key_position, used = rows
        slopes = torch.as_tensor(per_row_slopes(alibi_slopes, rows[0].cpu().numpy(), hq), dtype=q.dtype,
                                 device=device)  # (Hq, total_q)
        cap = None if softcap is None else torch.tensor(float(softcap), dtype=q.dtype, device=device)

        def document(bi, h, qi, ki):  # a key counts for a query of its own sequence only
            return cls._keep((query_seq[qi] == key_seq[ki]) & used[ki], query_position[qi], key_position[ki],
                             is_causal, window)

        def score_mod(score, bi, h, qi, ki):
            return cls._capped(score, cap) - slopes[h, qi] * (query_position[qi] - key_position[ki]).abs()

        total_q, total_k = q.shape[0], k.shape[0]
        block_mask = cls._block_mask(document, 1, None, total_q, total_k, device)
        # (1, H, total, D), contiguous, as flex takes its inputs.
        heads_first = [x.transpose(0, 1)[None].contiguous() for x in (q, k, v)]
        out = cls._with_sink(*heads_first, block_mask, score_mod, scale, learnable_sink, hq)
        return out[0].transpose(0, 1).contiguous()

    @classmethod
    def sdpa_paged(cls, q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
                   softcap=None, alibi_slopes=None, learnable_sink=None):
        import torch
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask

        device, (b, hq, lq, _), (pages, block, hkv, _) = q.device, q.shape, k_cache.shape
        table, used = host_ints(block_table), host_ints(seqused_k).reshape(-1)
        paged = PagedAttention(pages, block, b, device=str(device))
        for row in range(b):  # each sequence's used pages: physical page -> its logical block
            n = -(-int(used[row]) // block)
            paged.page_table[row, :n] = torch.as_tensor(table[row, :n], device=device)
            paged.physical_to_logical[row, torch.as_tensor(table[row, :n], device=device)] = torch.arange(n)
        lengths = torch.as_tensor(used, device=device)
        offset = lengths - lq  # bottom-right: query row i at i + seqused_k[b] - Lq
        slopes = torch.zeros((b, hq), dtype=q.dtype, device=device) if alibi_slopes is None \
            else slopes_4d(alibi_slopes, hq)[..., 0, 0].to(q.dtype).expand(b, hq)
        cap = None if softcap is None else torch.tensor(float(softcap), dtype=q.dtype, device=device)

        def logical(bi, h, qi, ki):
            return cls._keep(ki >= 0, qi + offset[bi], ki, is_causal, window)

        def score_mod(score, bi, h, qi, ki):
            return cls._capped(score, cap) - slopes[bi, h] * (qi + offset[bi] - ki).abs()

        logical_mask = create_block_mask(logical, b, None, lq, table.shape[1] * block, device=device,
                                         BLOCK_SIZE=(128, block))
        block_mask = paged.convert_logical_block_mask(logical_mask, kv_len=lengths)
        physical = [cache.permute(2, 0, 1, 3).reshape(1, hkv, pages * block, cache.shape[3])
                    for cache in (k_cache, v_cache)]
        return cls._with_sink(q, *physical, block_mask, paged.get_score_mod(score_mod, kv_len=lengths), scale,
                              learnable_sink, hq)

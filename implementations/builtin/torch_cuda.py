"""torch's scaled_dot_product_attention pinned to one CUDA kernel: flash, memory-efficient, cuDNN; each declares the
region it was measured to run and the conventions it was measured to have.
"""
from __future__ import annotations

import warnings

from attention_conformance.implementations.builtin.common import mha_with
from attention_conformance.implementations.builtin.cuda_deviations import (
    CUDA_CUDNN_MASKED_BACKWARD_NAN,
    CUDA_NAN_NONPOSITIVE_SCALE,
)
from attention_conformance.implementations.builtin.torch_backend import TorchSDPA


class _TorchSDPAKernel(TorchSDPA):
    """torch SDPA pinned to one CUDA kernel with torch.nn.attention.sdpa_kernel.

    A case the kernel rejects (torch raises "No available kernel") is unsupported,
    not failed: kernels legitimately refuse some dtypes, masks and head sizes.
    """

    ARRAY = "torch"
    DEVICES = ("cuda",)
    BACKEND = ""

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        # torch says why it refused the kernel in UserWarnings, one per check: the refusal's reason is the first
        # specific one (the H200 run printed 16,251 of them, one pytest warning each, and called every refusal
        # "No available kernel").
        with sdpa_kernel(getattr(SDPBackend, cls.BACKEND)), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return TorchSDPA.sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
            except RuntimeError as exc:
                if "No available kernel" in str(exc):
                    why = [text for text in (str(w.message).split(" (Triggered internally")[0] for w in caught)
                           if not text.endswith("not used because:") and "runtime disabled" not in text]
                    raise NotImplementedError(f"{cls.BACKEND}: {why[0] if why else str(exc).splitlines()[0]}") \
                        from None
                raise

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False):
        import torch  # the pinned kernels take no variant keyword (sdpa above)

        return mha_with(cls.sdpa, query, key, value, params, num_heads, mask, is_causal, torch)


class TorchFlashAttention(_TorchSDPAKernel):
    NAME = "torch_sdpa_flash"
    DTYPES = ("float16", "bfloat16")
    BACKEND = "FLASH_ATTENTION"
    # Its own, not the default dispatch's (which picks cuDNN for 16 bits): the H100 and H200 runs reported 342 and 338
    # of its cases under this one entry (sdpa.finite) and no other; it takes no mask, so cuDNN's are out of its reach.
    KNOWN_DEVIATIONS = (CUDA_NAN_NONPOSITIVE_SCALE,)
    # FlashAttention-2 in torch: head dims a multiple of 8 up to 256, Dv == Dk, no attn_mask (is_causal only), and
    # is_causal only where Lq == Lk (H200, torch 2.11: "Flash attention does not support the is_causal flag when
    # seqlen_q != seqlen_k", for 74 shapes of the run).
    SUPPORTS = {"head_dims": {"min": 8, "max": 256, "multiple": 8}, "value_head_dim": "same", "masks": ["none"],
                "causal": "lq==lk"}


class TorchMemoryEfficientAttention(_TorchSDPAKernel):
    NAME = "torch_sdpa_efficient"
    DTYPES = ("float32", "float16", "bfloat16")
    BACKEND = "EFFICIENT_ATTENTION"
    # Refuses enable_gqa (H100, torch 2.11: "No available kernel" for every Hq != Hkv case), and head dims that are
    # not a multiple of 16 bytes (H200, torch 2.11: "Mem efficient attention requires last dimension of inputs to be
    # divisible by 4" in float32, "by 8" in 16 bits, for Dk or Dv; 12,538 of its cases were refused so, 2,135 judged).
    SUPPORTS = {"gqa": False, "head_dims": {"multiple": 4}}
    HEAD_DIM_MULTIPLE_16BIT = 8
    # None: right where flash and cuDNN deviate (docs/gpu-runs/2026-11-23-h100/kernels-characterized.md: scale 0 and
    # -0.3, fully masked rows, 16 bits, errors at most 1.8e-3), and 0 deviations of 3293 (H100) and 3268 (H200) judged
    # cases in the suite's runs while it inherited the default dispatch's entries. Declaring them would hide those
    # defects.
    KNOWN_DEVIATIONS = ()

    @classmethod
    def supports(cls, facts):
        multiple = cls.HEAD_DIM_MULTIPLE_16BIT
        if facts.get("dtype") in ("float16", "bfloat16") and (facts["Dk"] % multiple or facts["Dv"] % multiple):
            return f"head dims Dk {facts['Dk']}, Dv {facts['Dv']}: in 16 bits a multiple of {multiple} (16 bytes)"
        return None


class TorchCuDNNAttention(_TorchSDPAKernel):
    NAME = "torch_sdpa_cudnn"
    DTYPES = ("float16", "bfloat16")
    BACKEND = "CUDNN_ATTENTION"
    SUPPORTS = {"head_dims": {"min": 8, "max": 256, "multiple": 8}, "value_head_dim": "same"}
    KNOWN_DEVIATIONS = TorchSDPA.KNOWN_DEVIATIONS + (CUDA_CUDNN_MASKED_BACKWARD_NAN,)

    @classmethod
    def supports(cls, facts):
        # H200, torch 2.11 (2026-11-27, commit 18ea361): "No available kernel" for every case with one key (498 sdpa
        # and 196 multi-head cases, forward and backward); no case with Lk 1 ran, 1,751 with Lk >= 2 did.
        if facts["Lk"] < 2:
            return "one key (Lk 1): torch's cuDNN backend refused every such case on an H200 (torch 2.11)"
        return None

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        # cuDNN takes a 2-D or 4-D attn_mask only ("Please use the following attn mask shapes: 2d ... 4d ...", 98
        # cases on an H200); a rank-3 mask (H|1, Lq, Lk) broadcasts as the same 4-D view (1, H|1, Lq, Lk).
        if mask is not None and mask.dim() == 3:
            mask = mask[None]
        return super().sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)

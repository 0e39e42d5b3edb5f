"""JAX's own attention: ``jax.nn.dot_product_attention`` (XLA; jax_dpa) and its cuDNN path (jax_dpa_cudnn), and the
Pallas flash kernel of ``jax.experimental.pallas.ops.gpu`` (jax_pallas_flash), each declaring what it was measured
to refuse and to do differently.
"""
from __future__ import annotations

import math

import numpy as np

from attention_conformance.implementations import deviations
from attention_conformance.implementations.builtin import jax_jit
from attention_conformance.implementations.builtin.common import (
    used_variants,
    differentiated_eagerly,
    head_groups,
    slopes_4d,
)
from attention_conformance.implementations.builtin.cuda_deviations import CUDA_16BIT_KERNEL_DEVIATIONS
from attention_conformance.implementations.builtin.jax_jit import jax_mha, softmax_in_buckets, x64_off


def _bounded_window(window, lq: int, lk: int):
    """jax.nn.dot_product_attention's local_window_size for a window: an unbounded side (None) becomes a size
    beyond every distance between a query and a key."""
    return None if window is None else tuple(lq + lk if side is None else int(side) for side in window)


# Errors by which a GPU compiler refuses a program (a refusal to compile, not a wrong result; declared as REFUSALS, so
# that a case meeting one, in its call or its gradients, is unsupported with the compiler's reason), measured:
# XLA:GPU refuses the F16_F16_F32 dot that jax.nn.dot_product_attention asks for in some float16 shapes (H100, jax
# 0.11.2: forward at Lq = Lk = 1, every head dim; H200, the same jax: the backward at Lq 3, Lk 7, Dk 1); other float16
# shapes run.
XLA_GPU_DOT_REFUSAL = "Unsupported dot precision algorithm"


# Triton refuses a Pallas kernel whose tiles need more shared memory than the GPU has (H200, jax 0.11.2, Pallas flash
# in float32 at Dk 128 with more than one key block: 262144 bytes asked, 232448 available).
TRITON_SHARED_MEMORY_REFUSAL = "Shared memory size limit exceeded"


class JaxDotProductAttention:
    """jax.nn.dot_product_attention.

    A row fully masked by a boolean mask averages v (JAX masks with a large finite
    negative, not -inf); a row whose float bias is all -inf is NaN (0/0). Both are
    declared, measured on jax 0.10.2, and reported as deviations.

    Dtypes on CPU, measured on jax 0.10.2: float64 inputs are computed at float32
    precision (the XLA path asks dot_general for float32 results; errors around 1e-8
    against the float64 oracle); float16 raises "The precision 'F16_F16_F32' is not
    supported by dot_general on CPU"; bfloat16 raises "Algorithm not supported by the
    ElementalIrEmitter: ALG_DOT_BF16_BF16_F32" for some small shapes. So only float32
    is declared on CPU.
    """

    NAME = "jax_dpa"
    ARRAY = "jax"
    DTYPES = {"cpu": ("float32",), "cuda": ("float32", "float16", "bfloat16")}
    # What sdpa below refuses (Dv != Dk; a query offset: the API has none), declared so that no case is drawn
    # only to be refused (about 100 unsupported cases a default run before).
    SUPPORTS = {"value_head_dim": "same", "variants": ["window", "alibi_slopes", "query_lengths", "key_lengths"]}
    # JAX's default matmul precision on NVIDIA GPUs rounds float32 matmul inputs to TF32 (H100, jax 0.11.2:
    # error 9.2e-4 at the default precision, 3.7e-7 at "highest"); this built-in judges JAX as users run it.
    FLOAT32_MATMUL = {"cuda": "tf32"}
    # Measured on jax 0.10.2 CPU: JAX folds the boolean mask, is_causal, the window and the key lengths into one
    # mask filled with -0.7 * finfo.max, so a row any of them empties averages v, also beside a float bias (the
    # older {"bool": "uniform", "float": "nan"} had said NaN for key-length rows of a case with a float mask); a
    # bias -inf on every key is NaN, and one -inf on every key those removals leave attends the removed keys.
    KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note="jax 0.10.2, measured on CPU"),)
    FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS
    REFUSALS = (XLA_GPU_DOT_REFUSAL,)

    @classmethod
    def supports(cls, facts):
        # H200, jax 0.11.2 (2026-11-27, commit 18ea361): XLA:GPU refused the float16 dot (XLA_GPU_DOT_REFUSAL) for
        # 131 of the 131 float16 cases with one key, sdpa and multi-head, and ran none; 15 other float16 refusals
        # (backward programs, Lk 5-65) follow no rule seen and stay unsupported at the call.
        if facts.get("device") == "cuda" and facts.get("dtype") == "float16" and facts["Lk"] < 2:
            return "float16 with one key (Lk 1) on cuda: XLA:GPU refused its dot in every such case (H200, jax 0.11.2)"
        return None

    @staticmethod
    def softmax(x, axis=-1):
        return softmax_in_buckets(JaxDotProductAttention._softmax, x, axis)

    @staticmethod
    def _softmax(x, axis=-1):
        import jax

        return jax.nn.softmax(x, axis=axis)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, alibi_slopes=None, query_offset=0,
             query_lengths=None, key_lengths=None):
        # No softcap (the API has none). Measured on jax 0.10.2 CPU (benchmarks/variant_probe.py): local_window_size
        # (l, r) allows i - l <= j <= i + r, both edges inclusive, aligned at query 0 (also when Lq != Lk, also with
        # is_causal), as the contract's window with query_offset 0; key_value_seq_lengths masks keys j >= length (a
        # row left with none averages v, as a fully masked boolean row does); query_seq_lengths zeroes the padding
        # rows. JAX has no query offset, so query_offset > 0 is refused. ALiBi travels as the API's bias.
        if k.shape[-1] != v.shape[-1]:
            raise NotImplementedError("jax.nn.dot_product_attention requires Dv == Dk")
        if query_offset:
            raise NotImplementedError("jax.nn.dot_product_attention has no query offset: is_causal and "
                                      "local_window_size are aligned at query 0")
        variants = used_variants(window=_bounded_window(window, q.shape[2], k.shape[2]), alibi_slopes=alibi_slopes,
                         query_lengths=query_lengths, key_lengths=key_lengths)
        # One program per structure: is_causal and the window static; the scale (a traced scalar; None stays
        # static), the mask and the variants' arrays traced.
        static = ("is_causal", "window") if variants else ("is_causal",)
        options = dict(variants, is_causal=is_causal, scale=None if scale is None else np.float64(scale))
        if differentiated_eagerly(q, k, v, mask) and not jax_jit.traced(alibi_slopes, query_lengths, key_lengths):
            return JaxDotProductAttention._sdpa_vjp(q, k, v, mask, static, options)
        return jax_jit.jitted(JaxDotProductAttention._sdpa, *static)(q, k, v, mask, **options)

    @staticmethod
    def _sdpa_vjp(q, k, v, mask, static: tuple, options: dict):
        """sdpa under an eager jax.vjp (the gradient tests): a custom_vjp whose forward is the forward tests' own
        program and whose backward is jax.vjp of the same body, one jitted program (forward recomputed, then the
        backward), as a jitted training step runs it. The plain eager vjp compiled a forward with its residuals and
        a backward per case. Differentiated: q, k, v and a float mask; a boolean mask is a constant."""
        import jax

        boolean = mask if mask is not None and np.dtype(mask.dtype) == np.bool_ else None
        forward = jax_jit.jitted(JaxDotProductAttention._sdpa, *static)
        backward = jax_jit.jitted(JaxDotProductAttention._sdpa_backward, *static)

        @jax.custom_vjp
        def attend(q, k, v, bias):
            return forward(q, k, v, boolean if bias is None else bias, **options)

        def forward_rule(q, k, v, bias):
            return attend(q, k, v, bias), (q, k, v, bias)

        def backward_rule(saved, d_out):
            q, k, v, bias = saved
            return tuple(backward(q, k, v, boolean if bias is None else bias, d_out, **options)) + (
                (None,) if bias is None else ())

        attend.defvjp(forward_rule, backward_rule)
        return attend(q, k, v, None if boolean is not None else mask)

    @staticmethod
    def _sdpa_backward(q, k, v, mask, d_out, **options):
        """(dq, dk, dv), and dmask for a float mask: the vjp of _sdpa at (q, k, v, mask) for upstream d_out."""
        import jax

        def attend(q, k, v, m=mask):
            return JaxDotProductAttention._sdpa(q, k, v, m, **options)

        primals = (q, k, v) if mask is None or mask.dtype == bool else (q, k, v, mask)  # a boolean mask: a constant
        return jax.vjp(attend, *primals)[1](d_out)

    @staticmethod
    def _sdpa(q, k, v, mask=None, is_causal=False, scale=None, window=None, alibi_slopes=None, query_lengths=None,
              key_lengths=None):
        import jax
        import jax.numpy as jnp

        if k.shape[-1] != v.shape[-1]:
            raise NotImplementedError("jax.nn.dot_product_attention requires Dv == Dk")
        if scale is not None:
            scale = jnp.asarray(scale, q.dtype)
        bias = boolean = None
        if mask is not None:
            mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape)
            if mask.dtype == jnp.bool_:
                boolean = mask
            else:
                bias = mask
        if alibi_slopes is not None:
            lq, lk = q.shape[2], k.shape[2]
            distance = jnp.abs(jnp.arange(lq)[:, None] - jnp.arange(lk)[None, :]).astype(alibi_slopes.dtype)
            alibi = (-slopes_4d(alibi_slopes, q.shape[1]) * distance).astype(q.dtype)
            bias = alibi if bias is None else alibi + bias
        out = jax.nn.dot_product_attention(
            jnp.swapaxes(q, 1, 2),  # the API's layout is (B, L, H, D)
            jnp.swapaxes(k, 1, 2),
            jnp.swapaxes(v, 1, 2),
            bias=bias,
            mask=boolean,
            scale=scale,
            is_causal=is_causal,
            query_seq_lengths=query_lengths,
            key_value_seq_lengths=key_lengths,
            local_window_size=window,
        )
        return jnp.swapaxes(out, 1, 2)

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             alibi_slopes=None, query_lengths=None, key_lengths=None):
        # The variants its sdpa takes, converted as there (an unbounded window side beyond every distance).
        window = _bounded_window(window, query.shape[1], key.shape[1])
        return jax_mha(JaxDotProductAttention._sdpa, query, key, value, params, num_heads, mask, is_causal,
                        **used_variants(window=window, alibi_slopes=alibi_slopes, query_lengths=query_lengths,
                                key_lengths=key_lengths))


class JaxCuDNNAttention:
    """jax.nn.dot_product_attention(implementation="cudnn"): cuDNN's fused attention.

    Measured on an H100 (jax 0.11.2): float16/bfloat16 only ("Q must be fp16/bf16/fp8"),
    Dv == Dk, head dims 8..256 a multiple of 8; a mask must span (Lq, Lk) ("Bias must
    have same seq length as QKV"), so the adapter broadcasts it; the scale must be a
    Python float (a traced one raises UnexpectedTracerError), so each scale compiles.
    """

    NAME = "jax_dpa_cudnn"
    ARRAY = "jax"
    DEVICES = ("cuda",)
    DTYPES = {"cuda": ("float16", "bfloat16")}
    SUPPORTS = {"head_dims": {"min": 8, "max": 256, "multiple": 8}, "value_head_dim": "same"}
    KNOWN_DEVIATIONS = CUDA_16BIT_KERNEL_DEVIATIONS

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        scale = None if scale is None else float(scale)
        return jax_jit.jitted(JaxCuDNNAttention._sdpa, "is_causal", "scale")(q, k, v, mask, is_causal=is_causal, scale=scale)

    @staticmethod
    def _sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        import jax
        import jax.numpy as jnp

        bias = boolean = None
        if mask is not None:
            mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape)
            mask = jnp.broadcast_to(mask, mask.shape[:2] + (q.shape[2], k.shape[2]))
            if mask.dtype == jnp.bool_:
                boolean = mask
            else:
                bias = mask.astype(q.dtype)
        out = jax.nn.dot_product_attention(
            jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2),
            bias=bias, mask=boolean, scale=scale, is_causal=is_causal, implementation="cudnn",
        )
        return jnp.swapaxes(out, 1, 2)


class JaxPallasFlashAttention:
    """The Pallas (Triton) flash attention kernel, jax.experimental.pallas.ops.gpu.attention.mha.

    Measured on an H100 (jax 0.11.2): sequence lengths must be multiples of its block
    (128) and array sizes powers of 2; it takes no mask; it assumes as many kv heads as
    query heads (given fewer, its output is silently wrong, errors 0.9), so the adapter
    repeats kv heads for GQA; its causal path fails under jax_enable_x64 (int32/int64
    in lax.div), so the adapter traces it with x64 off.

    Measured on an H200 (jax 0.11.2, 2026-11-27), with kernel-shaped cases: float32 runs its
    dots in TF32 (errors 1.1e-4 to 1.5e-4, 1.4x to 2.3x the float32 allowance, at Dk 64 and 128;
    Pallas's Triton lowering gives a dot of no precision TF32 inputs), declared; the causal key
    loop runs to the query block's diagonal, past the last key when Lq > Lk (Lq 256, Lk 128:
    1.6e8 in bfloat16, 0.15 off in float16), so causal cases need Lq <= Lk; float32 at Dk 128
    with more than one key block asks Triton for more shared memory than the GPU has (a
    refusal: unsupported); the fused backward refuses lengths split into different numbers of
    blocks (unsupported).
    """

    NAME = "jax_pallas_flash"
    ARRAY = "jax"
    DEVICES = ("cuda",)
    DTYPES = {"cuda": ("float32", "float16", "bfloat16")}
    SUPPORTS = {"head_dims": [16, 32, 64, 128], "value_head_dim": "same", "lengths": {"multiple": 128, "max": 2048},
                "masks": ["none"], "causal": "lq<=lk"}
    FLOAT32_MATMUL = {"cuda": "tf32"}
    REFUSALS = (TRITON_SHARED_MEMORY_REFUSAL,)
    BACKWARD_BLOCK = 32  # BlockSizes.get_default()'s block_q_dq and block_kv_dkv, the fused backward's blocks

    @staticmethod
    def sdpa(q, k, v, is_causal=False, scale=None):
        lq, lk = q.shape[2], k.shape[2]
        block = JaxPallasFlashAttention.BACKWARD_BLOCK
        if differentiated_eagerly(q, k, v) and lq // min(block, lq) != lk // min(block, lk):
            # mha's own check, made before the forward runs: it raises ValueError when the pullback is traced.
            raise NotImplementedError("Pallas flash's fused backward: q_seq_len and kv_seq_len must be divided "
                                      f"into the same number of blocks (Lq {lq}, Lk {lk}, blocks of {block})")
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        with x64_off():
            # The scale is static: mha passes it to a custom_vjp as a non-differentiable argument.
            return jax_jit.jitted(JaxPallasFlashAttention._sdpa, "is_causal", "scale")(q, k, v, is_causal=is_causal,
                                                                                scale=scale)

    @staticmethod
    def _sdpa(q, k, v, is_causal=False, scale=1.0):
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.gpu import attention

        group = head_groups(q, k)
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
        out = attention.mha(jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), None,
                            sm_scale=scale, causal=is_causal)
        return jnp.swapaxes(out, 1, 2)

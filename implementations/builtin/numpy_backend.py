"""NumPy paths: the float64 oracle itself as an implementation (numpy_oracle) and the same math computed in the input
dtype, rounding after every step as a kernel does (numpy_native), packed and paged batches included.
"""
from __future__ import annotations

import math

import numpy as np

from attention_conformance.implementations.builtin.common import (
    ALL_DTYPES,
    distance_matrix,
    projected,
    used_variants,
    document_mask,
    head_groups,
    merge_heads,
    merge_states_with,
    paged_gather,
    paged_mask,
    positions_allowed,
    sink_4d,
    slopes_4d,
    split_heads,
)


class NumpyOracle:
    NAME = "numpy_oracle"
    ARRAY = "numpy"
    DTYPES = ("float64",)

    @staticmethod
    def softmax(x, axis=-1):
        from attention_conformance.conformance.reference import oracle

        return oracle.softmax(x, axis=axis)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None, return_lse=False):
        from attention_conformance.conformance.reference import oracle

        variants = oracle.variant_options(dict(window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                               query_offset=query_offset, query_lengths=query_lengths,
                                               key_lengths=key_lengths, learnable_sink=learnable_sink,
                                               sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                                               key_leftpad=key_leftpad))
        attention = oracle.attention(q, k, v, mask, is_causal, scale, **variants)
        return (attention.output(), attention.lse()) if return_lse else attention.output()

    @staticmethod
    def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                             learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
        from attention_conformance.conformance.reference import oracle

        return oracle.multi_head_attention(query, key, value, params, num_heads, mask=mask, is_causal=is_causal,
                                           **used_variants(window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                                   query_offset=query_offset, query_lengths=query_lengths,
                                                   key_lengths=key_lengths, learnable_sink=learnable_sink,
                                                   sink_token_length=sink_token_length,
                                                   attention_chunk=attention_chunk, key_leftpad=key_leftpad))


def _accumulator(dtype: np.dtype) -> np.dtype:
    """Sums of 16-bit values accumulate in float32 and are rounded once, as kernels (and NumPy's own 16-bit
    matmuls) do: np.sum(dtype=bfloat16) rounds after every addition (4096 ones sum to 256), which put this
    built-in's bfloat16 decode output off by 84 % at Lk 2048 (found calibrating the 16-bit tolerance)."""
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


class NumpyNative:
    """The oracle's math in the input dtype: every intermediate is rounded to it.

    Matmuls and sums of 16-bit values accumulate in float32 and are rounded once
    (NumPy's float16 and bfloat16 matmuls do so themselves; sums are asked to); the
    score scale * q.k is one intermediate, scaled in the accumulator. merge_states is FlashInfer's merge kernel in
    float32 (common.merge_states_with).
    """

    NAME = "numpy_native"
    ARRAY = "numpy"
    DTYPES = ALL_DTYPES

    @staticmethod
    def softmax(x, axis=-1):
        dtype = x.dtype
        shifted = (x - np.max(x, axis=axis, keepdims=True)).astype(dtype)
        e = np.exp(shifted).astype(dtype)
        total = np.sum(e, axis=axis, keepdims=True, dtype=_accumulator(dtype)).astype(dtype)
        return (e / total).astype(dtype)

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None, return_lse=False):
        # query_lengths only marks padding rows, which the contract does not judge: every row is computed.
        dtype = q.dtype
        group = head_groups(q, k)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        lq, lk = q.shape[-2], k.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        # The score scale * q.k is one intermediate, rounded once: q.k accumulated and scaled in the accumulator (an
        # outlier channel takes the unscaled q.k past float16's range while the score stays inside it). A 16-bit score
        # may still overflow to inf: at a removed key (test_masked_keys_have_no_influence scales the dead keys' k) it
        # is masked below; at an attended one it reaches the output, where the judge sees it. No warning.
        acc = _accumulator(dtype)
        with np.errstate(over="ignore"):
            scores = ((q.astype(acc) @ np.swapaxes(k, -1, -2).astype(acc)) * acc.type(scale)).astype(dtype)
        if softcap is not None:
            cap = dtype.type(softcap)
            # A 16-bit score far past the cap (a packed batch's unused keys, masked below) overflows s / cap to inf,
            # whose tanh is 1: the saturated value, not worth a warning.
            with np.errstate(over="ignore"):
                scores = (np.tanh((scores / cap).astype(dtype)).astype(dtype) * cap).astype(dtype)
        if alibi_slopes is not None:
            distance = distance_matrix(lq, lk, query_offset).astype(dtype)
            scores = (scores - (slopes_4d(alibi_slopes, q.shape[1]).astype(dtype) * distance).astype(dtype))
            scores = scores.astype(dtype)
        allowed = positions_allowed(lq, lk, is_causal, window, query_offset, key_lengths,
                                     sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                                     key_leftpad=key_leftpad)
        if mask is not None and mask.dtype == np.bool_:
            allowed = allowed & mask
        elif mask is not None:
            scores = (scores + mask).astype(dtype)
        scores = np.where(allowed, scores, dtype.type(-np.inf))
        row_max = np.max(scores, axis=-1, keepdims=True)
        sink = None
        if learnable_sink is not None:  # the sink logit joins the maximum and the normaliser, in the input dtype
            sink = sink_4d(learnable_sink, q.shape[1]).astype(dtype)
            row_max = np.maximum(row_max, sink)
        empty = np.isneginf(row_max)
        # In float16 a row spanning more than the dtype's range makes scores - max overflow to -inf,
        # whose exp is the right weight, 0: not worth a warning.
        with np.errstate(over="ignore"):
            e = np.exp((scores - np.where(empty, 0, row_max)).astype(dtype)).astype(dtype)
            total = np.sum(e, axis=-1, keepdims=True, dtype=_accumulator(dtype))
            if sink is not None:
                total = total + np.exp((sink - row_max).astype(dtype)).astype(dtype)
        weights = (e / np.where(empty, 1, total.astype(dtype))).astype(dtype)
        out = (weights @ v).astype(dtype)
        if not return_lse:
            return out
        # lse = m + log Z in the accumulator, float32 (float64 in float64 cases); log 0 = -inf: a row without keys
        with np.errstate(divide="ignore"):
            lse = row_max[..., 0].astype(acc) + np.log(total[..., 0].astype(acc))
        return out, lse.astype(np.float64 if dtype == np.float64 else np.float32)

    @classmethod
    def sdpa_varlen(cls, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                    scale=None, *, seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None,
                    return_lse=False):
        # Document masking: one sdpa over the packed rows (batch 1), the sequences kept apart by the mask.
        mask = document_mask(cu_seqlens_q, cu_seqlens_k, seqused_k, is_causal, window, alibi_slopes, q.shape[1])
        got = cls.sdpa(np.swapaxes(q, 0, 1)[None], np.swapaxes(k, 0, 1)[None], np.swapaxes(v, 0, 1)[None],
                       mask=mask if mask.dtype == np.bool_ else mask.astype(q.dtype),
                       scale=1.0 / math.sqrt(q.shape[-1]) if scale is None else scale, softcap=softcap,
                       learnable_sink=learnable_sink, return_lse=return_lse)
        out = np.ascontiguousarray(np.swapaxes((got[0] if return_lse else got)[0], 0, 1))
        return (out, got[1][0]) if return_lse else out  # lse (Hq, total_q)

    @classmethod
    def sdpa_paged(cls, q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
                   softcap=None, alibi_slopes=None, learnable_sink=None, return_lse=False):
        # Each sequence's pages gathered into a padded batch, the keys past seqused_k masked.
        k = np.swapaxes(paged_gather(k_cache, block_table), 1, 2)
        v = np.swapaxes(paged_gather(v_cache, block_table), 1, 2)
        mask = paged_mask(seqused_k, q.shape[2], k.shape[2], is_causal, window, alibi_slopes, q.shape[1])
        return cls.sdpa(q, k, v, mask=mask if mask.dtype == np.bool_ else mask.astype(q.dtype), scale=scale,
                        softcap=softcap, learnable_sink=learnable_sink, return_lse=return_lse)

    @staticmethod
    def merge_states(out, lse, *, learnable_sink=None):
        return merge_states_with(np, out, lse, learnable_sink)

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                             learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
        dtype = query.dtype
        rounded = {name: p for name, p in params.items()}

        def project(x, name):
            return projected(x, rounded, name).astype(dtype)

        q = split_heads(project(query, "q"), num_heads, np)
        k = split_heads(project(key, "k"), num_heads, np)
        v = split_heads(project(value, "v"), num_heads, np)
        context = cls.sdpa(q, k, v, mask=mask, is_causal=is_causal, window=window, softcap=softcap,
                           alibi_slopes=alibi_slopes, query_offset=query_offset, key_lengths=key_lengths,
                           learnable_sink=learnable_sink, sink_token_length=sink_token_length,
                           attention_chunk=attention_chunk, key_leftpad=key_leftpad)
        return project(merge_heads(context, np), "o")

"""The contract's names: its operations, their optional keywords and defaults, the FULLY_MASKED_ROWS policies and
causes, the layouts and the sequence alignments (docs/contract.md). Every other module reads them from here.
"""
from __future__ import annotations

import numpy as np

OPERATIONS = ("softmax", "sdpa", "multi_head_attention", "sdpa_varlen", "sdpa_paged", "merge_states",
              "sdpa_sequence_parallel")


FULLY_MASKED_POLICIES = ("zeros", "nan", "uniform")


# What leaves a fully masked row without a key, in the order that attributes a row to one of them (the first that
# empties it on its own; docs/declarations.md, FULLY_MASKED_ROWS): the removals a kernel handles on a path of their
# own first, the masks last. The chunk (with the band and the window) and the left padding (with the key
# lengths, or with the band, the window and the chunk) come after the older causes, so that a row one of those
# empties on its own keeps its cause. The two mask kinds are also the keys of the older {"bool": ..., "float": ...}
# form.
FULLY_MASKED_CAUSES = ("key_lengths", "window", "causal", "attention_chunk", "key_leftpad", "bool", "float")


MASK_KIND_CAUSES = ("bool", "float")


# sdpa's q, k, v and output: (B, H, L, D) by default, or (B, L, H, D) (FlashAttention's, JAX's and Keras' layout).
LAYOUTS = ("bhld", "blhd")


LAYOUT_SHAPES = {"bhld": "(B, H, L, D)", "blhd": "(B, L, H, D)"}


LAYOUT_INPUTS = ("q", "k", "v")  # masks keep their (B|1, H|1, Lq, Lk) in every layout


FLOAT32_MATMUL_MODES = ("ieee", "tf32")


# Keywords whose default (the value in this dict) is never passed, so that an
# implementation without the parameter still runs every case that does not need it.
# The variant keywords of sdpa (docs/contract.md) and their defaults: keyword-only, passed only
# when a case uses them.
VARIANT_DEFAULTS = {"window": None, "softcap": None, "alibi_slopes": None, "query_offset": 0,
                    "query_lengths": None, "key_lengths": None,
                    # attention sinks, chunked local attention, left padding (FlashAttention's names).
                    "learnable_sink": None, "sink_token_length": 0, "attention_chunk": None, "key_leftpad": None}


# Packed variable-length batches and paged KV caches (docs/contract.md, spec/clauses.yaml varlen.*,
# paged.*): one sdpa per sequence, with the variant keywords that make sense per sequence.
SEQUENCE_VARIANT_DEFAULTS = {"window": None, "softcap": None, "alibi_slopes": None, "learnable_sink": None}


# FP8 attention (docs/contract.md, FP8): the descale factors of 8-bit q, k, v, float32 (B, Hkv) each,
# FlashAttention 3's names and shapes. Keyword-only and passed only to the 8-bit cases; not variant keywords (no
# "variants" fact, no SUPPORTS["variants"] entry): they are how 8-bit inputs carry their scale.
DESCALE_DEFAULTS = {"q_descale": None, "k_descale": None, "v_descale": None}


# The dtype of an 8-bit case's output (FP8_OUTPUT_DTYPE): FlashAttention 3 returns bfloat16 for float8 inputs.
FP8_OUTPUT_DTYPES = ("bfloat16", "float16")


# return_lse=True asks sdpa, sdpa_varlen, sdpa_paged and sdpa_sequence_parallel for (out, lse): the log of each row's
# softmax denominator (docs/contract.md, "The log-sum-exp"; its conventions declared by LSE_CONVENTION).
LSE_DEFAULTS = {"return_lse": False}


# LSE_CONVENTION: how an implementation's lse is written, where kernels differ (each key optional):
# "base": "e" (the natural log, FlashAttention's, flex attention's, cuDNN's) or "2" (FlashInfer's, the Pallas GPU
# kernel's); "empty_row": the lse of a row without keys, "-inf" (FlashAttention 3 and 4, flex, FlashInfer), "+inf"
# (FlashAttention 2, so that its backward's exp(s - lse) is 0), "0" (torch's CPU flash kernel), "nan" or
# "unspecified"; "sink": "included" (the learnable sink's term in the denominator whose log it is: FlashAttention 4,
# vLLM's FlashAttention 3, FlashInfer, splash) or "excluded" (gpt-oss's Triton kernel keeps the keys' alone).
LSE_CONVENTION_DEFAULTS = {"base": "e", "empty_row": "-inf", "sink": "included"}
LSE_CONVENTION_CHOICES = {"base": ("e", "2"), "empty_row": ("-inf", "+inf", "0", "nan", "unspecified"),
                          "sink": ("included", "excluded")}


# sdpa_sequence_parallel: sdpa of a sequence sharded across N devices, called on each device (a JAX device inside
# shard_map, a torch.distributed rank) with its shards; where each device's positions lie is the sequence layout.
SEQUENCE_LAYOUTS = ("contiguous", "zigzag")


OPTIONAL_KEYWORDS = {
    "softmax": {"axis": -1},
    "sdpa": {"mask": None, "is_causal": False, "scale": None, **VARIANT_DEFAULTS, **DESCALE_DEFAULTS, **LSE_DEFAULTS},
    # mha.variants: the same keywords, applied to each head's attention after the projections.
    "multi_head_attention": {"mask": None, "is_causal": False, **VARIANT_DEFAULTS},
    "sdpa_varlen": {"is_causal": False, "scale": None, "seqused_k": None, **SEQUENCE_VARIANT_DEFAULTS,
                    **LSE_DEFAULTS},
    "sdpa_paged": {"is_causal": False, "scale": None, **SEQUENCE_VARIANT_DEFAULTS, **LSE_DEFAULTS},
    # merge_states: partial attention states over disjoint key sets merged into the state over their union; a
    # learnable sink is given to the merge, once, never to the parts.
    "merge_states": {"learnable_sink": None},
    "sdpa_sequence_parallel": {"sequence_layout": "contiguous", "is_causal": False, "scale": None, "window": None,
                               "learnable_sink": None, **LSE_DEFAULTS},
}


# The positional arguments of each operation, in order.
POSITIONAL = {
    "softmax": ("x",),
    "sdpa": ("q", "k", "v"),
    "multi_head_attention": ("query", "key", "value", "params", "num_heads"),
    "sdpa_varlen": ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
    "sdpa_paged": ("q", "k_cache", "v_cache", "block_table", "seqused_k"),
    "merge_states": ("out", "lse"),
    "sdpa_sequence_parallel": ("q", "k", "v"),
}


SCALAR_POSITIONAL = ("num_heads", "max_seqlen_q", "max_seqlen_k")  # passed as Python ints, not arrays


# SEQUENCE_ALIGNMENT: where each sequence's queries sit against its keys in sdpa_varlen and sdpa_paged, which
# is_causal, the window and the ALiBi distance read: "bottom-right" (the default: FlashAttention's varlen and
# kvcache calls, FlashInfer, vLLM; query row i of a sequence of Lq queries and Lk keys at position i + Lk - Lq,
# the last query beside the last key) or "top-left" (row i at i: xformers' BlockDiagonalCausalMask).
SEQUENCE_ALIGNMENTS = ("bottom-right", "top-left")


def mask_cause(mask) -> str:
    """The cause a case's mask stands for (FULLY_MASKED_CAUSES): "float" for a float mask, "bool" otherwise, no mask
    included (the older {"bool": ..., "float": ...} form's key for the case)."""
    return "float" if mask is not None and np.asarray(mask).dtype != np.bool_ else "bool"


def missing_keywords_message(impl_name: str, op: str, keywords) -> str:
    """How every part of the suite says an operation's signature lacks keywords (conformance/reporting/summary.py groups
    skipped items by this wording)."""
    return f"{impl_name}.{op} has no {', '.join(repr(k) for k in keywords)} parameter"

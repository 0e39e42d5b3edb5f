"""Correct: 8-bit q, k, v dequantized to bfloat16 (x * descale rounded once) and attended in bfloat16 with float32
sums, the way FP8 KV caches are read on hardware without FP8 matmuls (vLLM's and FlashInfer's paths that dequantize K
and V to the query's 16-bit dtype) and the way FlashAttention 3's own test reference rounds its inputs
(hopper/test_util.py attention_ref: q = (q.float() * q_descale).to(bfloat16)). The attention itself is the built-in
numpy_native in bfloat16 (every step rounded to bfloat16, float32 accumulators).

Its errors are those of a 16-bit computation on inputs rounded once to bfloat16: the part of the eight_bit
tolerance (spec/tolerances.yaml) that follows section sixteen_bit, with the dequantized inputs' rounding (c_in). It
must pass.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from attention_conformance.implementations.builtin.numpy_backend import NumpyNative

BUG = "none"
SOURCE = ("vLLM / FlashInfer FP8 KV caches dequantized to the 16-bit query dtype; flash-attention hopper/test_util.py "
          "attention_ref (dequantized inputs in bfloat16)")
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float8_e4m3fn", "float8_e5m2")
FP8_OUTPUT_DTYPE = "bfloat16"


def dequantized(x, descale) -> np.ndarray:
    """x * descale (per (batch, kv head); repeated over a group's query heads for q) rounded to bfloat16."""
    values = np.asarray(x).astype(np.float32)
    if descale is not None:
        factors = np.asarray(descale, dtype=np.float32)
        values = values * np.repeat(factors, values.shape[1] // factors.shape[1], axis=1)[:, :, None, None]
    return values.astype(ml_dtypes.bfloat16)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
         query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
    return NumpyNative.sdpa(dequantized(q, q_descale), dequantized(k, k_descale), dequantized(v, v_descale), mask,
                            is_causal, scale, window=window, softcap=softcap, query_offset=query_offset,
                            query_lengths=query_lengths, key_lengths=key_lengths)

"""Broken: correct forward with every variant, a backward that recomputes P without the window (ARRAY = "torch")."""
from zoo import correct_torch_variant_backward as base

BUG = ("the backward recomputes the weights without the sliding window (only the mask, the causal band, the chunk and "
       "the lengths), so dq, dk and dv take gradient from keys the forward never attended.")
SOURCE = ("issue 25 list (window mask applied in forward but not backward): flash-style kernels recompute P in the "
          "backward and must repeat every masking of the forward (FlashAttention's apply_mask_local in "
          "flash_bwd_kernel.h)")
EXPECTED_CLAUSES = frozenset({"grad.variants"})
ARRAY = "torch"
DTYPES = base.DTYPES


class SDPA(base.VariantSDPA):
    BACKWARD_KEEPS_WINDOW = False  # BUG: P recomputed without the window


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
         attention_chunk=None, key_leftpad=None):
    return base.call(SDPA, q, k, v, mask, is_causal, scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                     query_offset=query_offset, key_lengths=key_lengths, learnable_sink=learnable_sink,
                     sink_token_length=sink_token_length, attention_chunk=attention_chunk, key_leftpad=key_leftpad)

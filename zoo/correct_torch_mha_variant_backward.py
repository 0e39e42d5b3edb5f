"""Correct: multi_head_attention with every variant keyword whose heads' attention has a hand-written backward
(ARRAY = "torch").

The projections, the head split and merge and the output projection are torch ops (autograd differentiates them,
the parameters included); each head's attention is correct_torch_variant_backward's ``VariantSDPA``, a
torch.autograd.Function with the analytic backward of docs/gradients.md, P recomputed in the backward as flash kernels
do. So the gradients of query, key, value, w_q ... b_o and the learnable sink are training's, through a kernel-style
backward. The broken multi-head backward members hand a broken ``VariantSDPA`` subclass to ``mha_of`` (# BUG there).
"""
from __future__ import annotations

from zoo import correct_torch_variant_backward as attention

BUG = "none"
SOURCE = ("torch.autograd.Function docs (custom forward/backward); docs/gradients.md (multi-head attention's "
          "gradients: the chain rule through the projections around each head's sdpa backward)")
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = attention.DTYPES


def mha_of(function):
    """The contract's multi_head_attention (every variant keyword) around ``function`` (VariantSDPA or a broken
    member's subclass) as each head's attention."""
    sdpa = attention.sdpa_of(function)

    def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                             learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
        def project(x, name):
            y = x @ params["w_" + name]
            return y if params.get("b_" + name) is None else y + params["b_" + name]

        def split(x):  # (B, L, H * D) -> (B, H, L, D): head h is the h-th block of columns
            b, length, width = x.shape
            return x.reshape(b, length, num_heads, width // num_heads).transpose(1, 2)

        # query_lengths only marks padding rows, which the contract leaves unspecified: every row is computed.
        context = sdpa(split(project(query, "q")), split(project(key, "k")), split(project(value, "v")), mask,
                       is_causal, None, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                       query_offset=query_offset, key_lengths=key_lengths, learnable_sink=learnable_sink,
                       sink_token_length=sink_token_length, attention_chunk=attention_chunk, key_leftpad=key_leftpad)
        b, heads, length, width = context.shape
        return project(context.transpose(1, 2).reshape(b, length, heads * width), "o")

    return multi_head_attention


multi_head_attention = mha_of(attention.VariantSDPA)

"""Correct: multi_head_attention with every variant keyword (mha.variants), one head at a time.

Written from the contract (README "The contract"; spec/clauses.yaml mha.variants): project, then for each head h
take the h-th block of columns of w_q, w_k, w_v, run the attention of one head with the variant keywords (ALiBi's
slope and the sink logit of head h only), and concatenate the heads' outputs before w_o. The per-head attention is
correct_sink_chunk_leftpad_reference.attend (every sdpa variant, in the order of sdpa.variant-order), so this member
checks the head loop, not the variants again. The broken_mha_* variant members change one line of ``head_options``
or of the loop (marked # BUG).
"""
from __future__ import annotations

import numpy as np

from zoo import _reference as ref
from zoo import correct_sink_chunk_leftpad_reference as per_head

BUG = "none"
SOURCE = "README 'The contract' (multi_head_attention's variant keywords); spec/clauses.yaml mha.variants"
EXPECTED_CLAUSES = frozenset()
# float64 and float32: the self-check runs every fixture and MHA property in each declared dtype (93 s with all four
# on the 2-core machine); numpy_native and torch_math judge MHA's variants in 16-bit in every default run.
DTYPES = ("float64", "float32")


def head_options(h: int, window=None, softcap=None, alibi_slopes=None, query_offset=0, key_lengths=None,
                 learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None) -> dict:
    """The keywords of head h's attention: the per-head parameters cut to head h, the others as they are."""
    slopes = None if alibi_slopes is None else ref.as64(alibi_slopes)[..., h:h + 1]
    sink = None if learnable_sink is None else ref.as64(learnable_sink)[h:h + 1]
    return dict(window=window, softcap=softcap, alibi_slopes=slopes, query_offset=query_offset,
                key_lengths=key_lengths, learnable_sink=sink, sink_token_length=sink_token_length,
                attention_chunk=attention_chunk, key_leftpad=key_leftpad)


def heads_loop(query, key, value, params, num_heads, mask, is_causal, options_of, **variants):
    """Project, attend head by head with ``options_of(h, **variants)``, merge, project out (float64)."""
    def project(x, name):
        return ref.project(x, params["w_" + name], params.get("b_" + name))

    q, k, v = project(query, "q"), project(key, "k"), project(value, "v")
    dk, dv = q.shape[-1] // num_heads, v.shape[-1] // num_heads
    heads = []
    for h in range(num_heads):
        q_h = q[:, None, :, h * dk:(h + 1) * dk]
        k_h = k[:, None, :, h * dk:(h + 1) * dk]
        v_h = v[:, None, :, h * dv:(h + 1) * dv]
        m = None if mask is None else np.asarray(mask)
        if m is not None and m.ndim >= 3 and m.shape[-3] == num_heads:  # a per-head mask: head h's own
            m = m[..., h:h + 1, :, :]
        heads.append(per_head.attend(q_h, k_h, v_h, m, is_causal, None, **options_of(h, **variants))[:, 0])
    return project(np.concatenate(heads, axis=-1), "o")


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                         softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                         learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
    # query_lengths only marks padding rows, which the contract leaves unspecified: every row is computed.
    out = heads_loop(query, key, value, params, num_heads, mask, is_causal, head_options, window=window,
                     softcap=softcap, alibi_slopes=alibi_slopes, query_offset=query_offset, key_lengths=key_lengths,
                     learnable_sink=learnable_sink, sink_token_length=sink_token_length,
                     attention_chunk=attention_chunk, key_leftpad=key_leftpad)
    return out.astype(ref.out_dtype(query))

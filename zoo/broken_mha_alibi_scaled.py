"""Broken: multi_head_attention adds the ALiBi bias before the 1/sqrt(Dk) scale, so the bias is scaled too."""
import math

from zoo import correct_mha_variants_loop as base

BUG = ("multi_head_attention adds each head's ALiBi bias -slope * |p_i - j| to q.k before multiplying by "
       "1/sqrt(Dk), so the bias enters scaled (slopes effectively divided by sqrt(Dk)).")
SOURCE = ("known bug class (ALiBi inside MHA); BLOOM's attention computes baddbmm(alibi, q, k^T, beta=1.0, "
          "alpha=1/sqrt(head_dim)): the bias must take beta = 1, not the scores' alpha")
EXPECTED_CLAUSES = frozenset({"sdpa.alibi", "mha.variants"})
DTYPES = base.DTYPES


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                         softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                         learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
    head_width = params["w_q"].shape[1] // num_heads
    if alibi_slopes is not None:
        alibi_slopes = base.ref.as64(alibi_slopes) / math.sqrt(head_width)  # BUG: the bias scaled with q.k
    out = base.heads_loop(query, key, value, params, num_heads, mask, is_causal, base.head_options, window=window,
                          softcap=softcap, alibi_slopes=alibi_slopes, query_offset=query_offset,
                          key_lengths=key_lengths, learnable_sink=learnable_sink,
                          sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                          key_leftpad=key_leftpad)
    return out.astype(base.ref.out_dtype(query))

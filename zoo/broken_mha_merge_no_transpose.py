"""Broken: the heads are merged with a reshape that skips the transpose back."""
from zoo import _reference as ref

BUG = ("multi_head_attention merges the (B, H, Lq, Dv) head outputs with "
       "values.reshape(B, Lq, H*Dv) without transposing back to (B, Lq, H, Dv), "
       "scrambling positions and heads.")
SOURCE = ("001_b3ba44c054c44630.txt, In [32] and In [42] MultiheadAttention.forward: "
          "values.reshape(batch_size, sequence_length, num_heads * head_dim)")
EXPECTED_CLAUSES = frozenset({"mha.head-merge"})


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    dk = params["w_q"].shape[1] // num_heads
    q = ref.split_heads(ref.project(query, params["w_q"], params.get("b_q")), num_heads)
    k = ref.split_heads(ref.project(key, params["w_k"], params.get("b_k")), num_heads)
    v = ref.split_heads(ref.project(value, params["w_v"], params.get("b_v")), num_heads)
    o = ref.attention64(q, k, v, mask, is_causal, scale=ref.default_scale(dk))
    b, h, lq, dv = o.shape
    merged = o.reshape(b, lq, h * dv)  # BUG: no transpose(0, 2, 1, 3) first
    out = ref.project(merged, params["w_o"], params.get("b_o"))
    return out.astype(ref.out_dtype(query))

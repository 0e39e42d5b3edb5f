"""Broken: keys and values are projected from query (self-attention only)."""
from zoo import _reference as ref

BUG = ("multi_head_attention projects keys and values from query (self-attention only), "
       "ignoring the key and value arguments.")
SOURCE = "001_b3ba44c054c44630.txt, In [42] MultiheadAttention.forward(x): q, k, v all from qkv_layer(x)"
EXPECTED_CLAUSES = frozenset({"mha.cross-attention"})


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    dk = params["w_q"].shape[1] // num_heads
    q = ref.split_heads(ref.project(query, params["w_q"], params.get("b_q")), num_heads)
    k = ref.split_heads(ref.project(query, params["w_k"], params.get("b_k")), num_heads)  # BUG: key
    v = ref.split_heads(ref.project(query, params["w_v"], params.get("b_v")), num_heads)  # BUG: value
    o = ref.attention64(q, k, v, mask, is_causal, scale=ref.default_scale(dk))
    out = ref.project(ref.merge_heads(o), params["w_o"], params.get("b_o"))
    return out.astype(ref.out_dtype(query))

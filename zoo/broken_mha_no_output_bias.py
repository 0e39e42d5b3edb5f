"""Broken: the output bias b_o is never added."""
from zoo import _reference as ref

BUG = "multi_head_attention applies w_o but never adds the output bias b_o."
SOURCE = "zoo extra: output projection written as merged @ w_o"
EXPECTED_CLAUSES = frozenset({"mha.output-projection"})


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    dk = params["w_q"].shape[1] // num_heads
    q = ref.split_heads(ref.project(query, params["w_q"], params.get("b_q")), num_heads)
    k = ref.split_heads(ref.project(key, params["w_k"], params.get("b_k")), num_heads)
    v = ref.split_heads(ref.project(value, params["w_v"], params.get("b_v")), num_heads)
    o = ref.attention64(q, k, v, mask, is_causal, scale=ref.default_scale(dk))
    out = ref.project(ref.merge_heads(o), params["w_o"])  # BUG: b_o dropped
    return out.astype(ref.out_dtype(query))

"""Broken: the input projection biases b_q, b_k, b_v are ignored."""
from zoo import _reference as ref

BUG = ("multi_head_attention ignores the input projection biases b_q, b_k, b_v (b_o is "
       "still added).")
SOURCE = "zoo extra: projections written as x @ w (nn.Linear(bias=False) habit of 004_c2f71d5cd411389d.txt)"
EXPECTED_CLAUSES = frozenset({"mha.projections"})


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    dk = params["w_q"].shape[1] // num_heads
    # BUG: params.get("b_q"/"b_k"/"b_v") never passed
    q = ref.split_heads(ref.project(query, params["w_q"]), num_heads)
    k = ref.split_heads(ref.project(key, params["w_k"]), num_heads)
    v = ref.split_heads(ref.project(value, params["w_v"]), num_heads)
    o = ref.attention64(q, k, v, mask, is_causal, scale=ref.default_scale(dk))
    out = ref.project(ref.merge_heads(o), params["w_o"], params.get("b_o"))
    return out.astype(ref.out_dtype(query))

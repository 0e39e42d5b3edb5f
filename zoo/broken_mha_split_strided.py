"""Broken: heads split from strided columns (h, h+H, ...) instead of contiguous blocks."""
from zoo import _reference as ref

BUG = ("multi_head_attention splits heads with reshape(B, L, D, H), so head h takes the "
       "strided columns h, h+H, h+2H, ... instead of the contiguous block h*D .. "
       "(h+1)*D-1.")
SOURCE = "zoo extra: reshape with the head and width axes swapped"
EXPECTED_CLAUSES = frozenset({"mha.head-split"})


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    def split_heads(x, h):
        b, l, f = x.shape
        return x.reshape(b, l, f // h, h).transpose(0, 3, 1, 2)  # BUG: should be (b, l, h, f // h)

    dk = params["w_q"].shape[1] // num_heads
    q = split_heads(ref.project(query, params["w_q"], params.get("b_q")), num_heads)
    k = split_heads(ref.project(key, params["w_k"], params.get("b_k")), num_heads)
    v = split_heads(ref.project(value, params["w_v"], params.get("b_v")), num_heads)
    o = ref.attention64(q, k, v, mask, is_causal, scale=ref.default_scale(dk))
    out = ref.project(ref.merge_heads(o), params["w_o"], params.get("b_o"))
    return out.astype(ref.out_dtype(query))

"""Broken: head width taken as E // num_heads instead of from the weights."""
from zoo import _reference as ref

BUG = ("multi_head_attention takes the head width as E // num_heads (E the model width) "
       "instead of w_q.shape[1] // num_heads, so it fails or mis-splits when the head "
       "width is not E / H.")
SOURCE = "001_b3ba44c054c44630.txt, In [11] and In [42]: head_dim = d_model // num_heads"
EXPECTED_CLAUSES = frozenset({"mha.head-width-free"})


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    e = query.shape[-1]
    hd = e // num_heads  # BUG: should be params["w_q"].shape[1] // num_heads (and w_v for Dv)

    def split_heads(x):
        b, l, _ = x.shape
        return x.reshape(b, l, num_heads, hd).transpose(0, 2, 1, 3)

    q = split_heads(ref.project(query, params["w_q"], params.get("b_q")))
    k = split_heads(ref.project(key, params["w_k"], params.get("b_k")))
    v = split_heads(ref.project(value, params["w_v"], params.get("b_v")))
    o = ref.attention64(q, k, v, mask, is_causal, scale=ref.default_scale(hd))
    out = ref.project(ref.merge_heads(o), params["w_o"], params.get("b_o"))
    return out.astype(ref.out_dtype(query))

"""Broken: multi-head attention without the 1/sqrt(Dk) scaling."""
from zoo import _reference as ref

BUG = "multi_head_attention never scales the scores (no 1/sqrt(Dk), scale 1)."
SOURCE = ("004_c2f71d5cd411389d.txt, 'Multi-Head Attention', In [72]: "
          "wei = torch.einsum('bihk,bjhk->bhij', query, key) is not scaled")
EXPECTED_CLAUSES = frozenset({"mha.scale-head-dim"})


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    q = ref.split_heads(ref.project(query, params["w_q"], params.get("b_q")), num_heads)
    k = ref.split_heads(ref.project(key, params["w_k"], params.get("b_k")), num_heads)
    v = ref.split_heads(ref.project(value, params["w_v"], params.get("b_v")), num_heads)
    o = ref.attention64(q, k, v, mask, is_causal, scale=1.0)  # BUG: no 1/sqrt(Dk)
    out = ref.project(ref.merge_heads(o), params["w_o"], params.get("b_o"))
    return out.astype(ref.out_dtype(query))

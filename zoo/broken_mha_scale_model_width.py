"""Broken: each head's scores are divided by sqrt(E) (model width), not sqrt(Dk)."""
import math

from zoo import _reference as ref

BUG = ("multi_head_attention scales every head's scores by 1/sqrt(E), E the model "
       "(embedding) width, instead of 1/sqrt(Dk), the head width.")
SOURCE = ("000_ef9a8195ca3d79bb.txt, In [36] MultiHeadAttention.forward: "
          "similarity = (q @ k.transpose(1,2)) / (self.embed_dim ** 0.5)")
EXPECTED_CLAUSES = frozenset({"mha.scale-head-dim"})


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    e = query.shape[-1]
    q = ref.split_heads(ref.project(query, params["w_q"], params.get("b_q")), num_heads)
    k = ref.split_heads(ref.project(key, params["w_k"], params.get("b_k")), num_heads)
    v = ref.split_heads(ref.project(value, params["w_v"], params.get("b_v")), num_heads)
    o = ref.attention64(q, k, v, mask, is_causal, scale=1.0 / math.sqrt(e))  # BUG: sqrt(E)
    out = ref.project(ref.merge_heads(o), params["w_o"], params.get("b_o"))
    return out.astype(ref.out_dtype(query))

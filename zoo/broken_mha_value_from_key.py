"""Broken: multi-head attention projects the values from the key input (value is never read)."""
from zoo import _reference as ref

BUG = "multi_head_attention computes v = key @ w_v instead of value @ w_v: right only when key is value."
SOURCE = "an independently written implementation: generated cases reach it only where key and value differ"
EXPECTED_CLAUSES = frozenset({"mha.projections", "mha.cross-attention", "mha.output-projection", "mha.head-split",
                              "mha.head-merge", "mha.scale-head-dim", "mha.head-width-free", "mask.broadcast",
                              "causal.top-left"})


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    return ref.multi_head_attention(query, key, key, params, num_heads, mask, is_causal)  # BUG: key for value

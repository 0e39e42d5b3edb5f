"""Correct (as written): 002_0d44a559eab251ab.txt, 'Extending Single-Head Attention to Multi-Head Attention',
``MultiHeadAttention`` (rasbt, LLMs-from-scratch ch03).

The class below is the document's, copied verbatim: W_query / W_key / W_value
(bias only if qkv_bias), view + transpose into heads, a registered triu(ones,
diagonal=1) buffer filling the future with -inf (always causal), softmax of
scores / sqrt(head_dim), transpose back and view to (b, num_tokens, d_out), then
out_proj (with bias). The wrapper builds it with d_in = query width, d_out = the
projection width, context_length = Lq, dropout 0.0 and qkv_bias = whether any of
b_q, b_k, b_v is given (missing ones zero), copies our (in, out) weights into its
nn.Linear layers (weight = w.T) and calls forward.

It can only express causal self-attention (the class is always causal) without an
explicit mask, with q, k and v heads of one width d_out / num_heads and w_o of
shape (d_out, d_out); anything else raises NotImplementedError.
"""
import torch
import torch.nn as nn

BUG = "none"
SOURCE = ("002_0d44a559eab251ab.txt, 'Extending Single-Head Attention to Multi-Head Attention', "
          "MultiHeadAttention (rasbt LLMs-from-scratch; copied verbatim, wrapped)")
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float32", "float64")


# ------------------------------------------------------------ document code, verbatim
class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert (d_out % num_heads == 0), \
            "d_out must be divisible by num_heads"

        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads # Reduce the projection dim to match desired output dim

        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # Linear layer to combine head outputs
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(
            "mask",
            torch.triu(torch.ones(context_length, context_length),
                       diagonal=1)
        )

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        # b is the num of batches
        # num_tokens is the number of tokens per batch
        # d_in is the dimensions er token

        keys = self.W_key(x) # Shape: (b, num_tokens, d_out)
        queries = self.W_query(x)
        values = self.W_value(x)

        # We implicitly split the matrix by adding a `num_heads` dimension
        # Unroll last dim: (b, num_tokens, d_out) -> (b, num_tokens, num_heads, head_dim)
        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim) 
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)

        # Transpose: (b, num_tokens, num_heads, head_dim) -> (b, num_heads, num_tokens, head_dim)
        keys = keys.transpose(1, 2)
        queries = queries.transpose(1, 2)
        values = values.transpose(1, 2)

        # Compute scaled dot-product attention (aka self-attention) with a causal mask
        attn_scores = queries @ keys.transpose(2, 3)  # Dot product for each head

        # Original mask truncated to the number of tokens and converted to boolean
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]

        # Use the mask to fill attention scores
        attn_scores.masked_fill_(mask_bool, -torch.inf)
        
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)

        # Shape: (b, num_tokens, num_heads, head_dim)
        context_vec = (attn_weights @ values).transpose(1, 2) 
        
        # Combine heads, where self.d_out = self.num_heads * self.head_dim
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        context_vec = self.out_proj(context_vec) # optional projection

        return context_vec
# ------------------------------------------------------------- end of the document's code


def _load(linear, w, b):
    """Our x @ w + b into nn.Linear (weight is (out, in)); a missing bias is zero."""
    linear.weight.copy_(w.T)
    if linear.bias is not None:
        if b is None:
            linear.bias.zero_()
        else:
            linear.bias.copy_(b)


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    p = {n: torch.as_tensor(t) for n, t in params.items() if t is not None}
    d_in, num_tokens = query.shape[-1], query.shape[-2]
    d_out = p["w_q"].shape[1]
    if mask is not None:
        raise NotImplementedError("the 002 MultiHeadAttention.forward(x) takes no mask")
    if not is_causal:
        raise NotImplementedError("the 002 MultiHeadAttention is always causal: is_causal=True only")
    if not (torch.equal(key, query) and torch.equal(value, query)):
        raise NotImplementedError("the 002 MultiHeadAttention is self-attention only (forward(x))")
    if d_out % num_heads or p["w_v"].shape[1] != d_out or p["w_o"].shape != (d_out, d_out):
        raise NotImplementedError(
            "the 002 MultiHeadAttention needs q, k and v heads of one width d_out / num_heads "
            "and w_o of shape (d_out, d_out)")
    qkv_bias = any(f"b_{n}" in p for n in "qkv")
    module = MultiHeadAttention(d_in, d_out, num_tokens, 0.0, num_heads, qkv_bias=qkv_bias)
    module = module.to(device=query.device, dtype=query.dtype).eval()
    with torch.no_grad():
        for layer, n in ((module.W_query, "q"), (module.W_key, "k"), (module.W_value, "v"), (module.out_proj, "o")):
            _load(layer, p[f"w_{n}"], p.get(f"b_{n}"))
    return module(query)

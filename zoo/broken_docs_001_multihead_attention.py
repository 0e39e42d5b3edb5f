"""Broken (as written): 001_b3ba44c054c44630.txt, In [42] ``MultiheadAttention`` (+ In [38] ``scaled_dot_product``).

The function and class below are the document's, copied verbatim except that the
class's per-call ``print`` lines are commented out (they only print shapes). Two
bugs come with them:

* the merge ``values.reshape(batch_size, sequence_length, num_heads * head_dim)``
  of the (B, H, L, D) head outputs skips the transpose back to (B, L, H, D), so
  positions and heads are scrambled (mha.head-merge);
* ``scaled_dot_product`` tests ``if mask:``, which raises "Boolean value of Tensor
  with more than one value is ambiguous" for any mask of more than one element.

Packing: the class has one ``qkv_layer = nn.Linear(input_dim, 3 * d_model)`` whose
output is reshaped to (B, L, num_heads, 3 * head_dim) and chunked, so per position
the 3 * d_model outputs are laid out per head as [q_h | k_h | v_h]. The wrapper
builds that packed weight so head h's q, k and v columns are our columns
h*D .. (h+1)*D - 1 of w_q, w_k and w_v (weight = packed.T; missing biases zero).

Masks: the document's mask is additive (In [20]-[22]: a float tensor of 0 and -inf
added to the scaled scores), so the wrapper passes a float mask as it is, a bool
mask as 0 / -inf, and is_causal as the document's own causal mask
``torch.triu(torch.full(scores.size(), -inf), diagonal=1)`` (added to the explicit
mask if both are given). The module then decides with its ``if mask:``; mask=None
cases run normally.

It can only express self-attention (forward(x)) with head widths d_model /
num_heads for q, k and v alike and w_o of shape (d_model, d_model); anything else
raises NotImplementedError.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BUG = ("MultiheadAttention merges the (B, H, L, D) head outputs with "
       "values.reshape(batch_size, sequence_length, num_heads * head_dim) without transposing back, "
       "scrambling positions and heads; its scaled_dot_product also tests `if mask:`, which raises "
       "for any mask tensor of more than one element.")
SOURCE = ("001_b3ba44c054c44630.txt, In [42] MultiheadAttention.forward (values.reshape without transpose) "
          "and In [38] scaled_dot_product (`if mask: scaled += mask`)")
EXPECTED_CLAUSES = frozenset({"mha.head-merge"})
ARRAY = "torch"
DTYPES = ("float32", "float64")


# ----------------------------------------------------------------- In [38], verbatim
# put all self attention lines of code above into one function
# note that mask is optional to reflect the fact self attention can be calculated on either the encoder (no mask) or the decoder (mask)
def scaled_dot_product(q, k, v, mask=None):
    d_k = q.size()[-1] # 64
    # must use k.transpose instead of k.T, since it is 4 dimensional and we want to specify only a subset of dimension on which to transpose
    # here we transpose on the last 2 dimensions which are the sequence length and the head dimension size 
    scaled = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d_k) # attention matrices for all heads within each batch
    if mask:
        # mask the attention values for the decoder so that we each word cannot only fetch information from words appearing before it
        # ensure the autoregressive nature of a translation task
        scaled += mask
    
    attention = F.softmax(scaled, dim=-1)
    # generated the new value vector that are more context aware then its previous values
    values = torch.matmul(attention, v)
    return values, attention
# ----------------------------------------------------------------- In [42], verbatim (prints commented out)
class MultiheadAttention(nn.Module):
    def __init__(self, input_dim, d_model, num_heads):
        super().__init__()
        self.input_dim = input_dim
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.qkv_layer = nn.Linear(input_dim, 3 * d_model)
        self.linear_layer = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        batch_size, sequence_length, input_dim = x.size()
        # print(f"x.size(): {x.size()}")
        qkv = self.qkv_layer(x)
        # print(f"qkv.size(): {qkv.size()}")
        # get concatenated qkv vectors, this time split by attention head
        qkv = qkv.reshape(batch_size, sequence_length, self.num_heads, 3 *self. head_dim)
        # print(f"qkv.size(): {qkv.size()}")
        qkv = qkv.permute(0, 2, 1, 3) # put the head dimension before the sequence length dimension for parallelization on the last 2 dimensiosn
        # print(f"qkv.size(): {qkv.size()}")
        # now split separate q, k, v vectors
        q, k, v = qkv.chunk(3, dim=-1) # -1 = last dimension
        # print(f"q.size(): {q.size()} k.size(): {k.size()}, v.size(): {v.size()}")
        values, attention = scaled_dot_product(q, k, v, mask=mask)
        # print(f"values.size(): {values.size()}, attention.size(): {attention.size()}")
        # reconcatenate value vectors along the number of heads dimension
        values = values.reshape(batch_size, sequence_length, self.num_heads * self.head_dim)
        # print(f"values.size(): {values.size()}")
        out = self.linear_layer(values)
        # print(f"out.size() : {out.size()}")
        return out
# ------------------------------------------------------------- end of the document's code


def _packed(p, name, h, d):
    """Per head [q_h | k_h | v_h]: our columns h*d..(h+1)*d-1 of each projection (weights or biases)."""
    parts = []
    for i in range(h):
        cols = slice(i * d, (i + 1) * d)
        for n in "qkv":
            t = p.get(f"{name}_{n}")
            if t is None:  # a missing bias is zero
                t = torch.zeros(h * d, dtype=p["w_q"].dtype, device=p["w_q"].device)
            parts.append(t[..., cols])
    return torch.cat(parts, dim=-1)


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    p = {n: torch.as_tensor(t) for n, t in params.items() if t is not None}
    b, lq, e = query.shape
    h = num_heads
    d_model = p["w_q"].shape[1]
    if not (torch.equal(key, query) and torch.equal(value, query)):
        raise NotImplementedError("In [42] MultiheadAttention is self-attention only (forward(x))")
    if d_model % h or p["w_v"].shape[1] != d_model or p["w_o"].shape != (d_model, d_model):
        raise NotImplementedError(
            "In [42] MultiheadAttention needs q, k and v heads of one width d_model / num_heads "
            "and w_o of shape (d_model, d_model)")
    module = MultiheadAttention(e, d_model, h).to(device=query.device, dtype=query.dtype).eval()
    with torch.no_grad():
        module.qkv_layer.weight.copy_(_packed(p, "w", h, d_model // h).T)
        module.qkv_layer.bias.copy_(_packed(p, "b", h, d_model // h))
        module.linear_layer.weight.copy_(p["w_o"].T)
        if "b_o" in p:
            module.linear_layer.bias.copy_(p["b_o"])
        else:
            module.linear_layer.bias.zero_()
    # The document's masks are additive float tensors (In [20]-[22]).
    doc_mask = None
    if mask is not None:
        mask = torch.as_tensor(mask)
        if mask.dtype == torch.bool:
            doc_mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(~mask, float("-inf"))
        else:
            doc_mask = mask.to(query.dtype)
    if is_causal:
        # In [20]: mask = torch.triu(torch.full(scaled.size(), float('-inf')), diagonal=1)
        causal = torch.triu(torch.full((b, h, lq, lq), float("-inf"), dtype=query.dtype, device=query.device),
                            diagonal=1)
        doc_mask = causal if doc_mask is None else doc_mask + causal
    return module(query, mask=doc_mask)

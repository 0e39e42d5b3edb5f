"""Broken (as written): 000_ef9a8195ca3d79bb.txt, In [36], the looped ``MultiHeadAttention``.

The class below is the document's, copied verbatim. It loops over heads, each with
its own nn.Linear(embed_dim, head_dim) for Q, K and V, and divides every head's
scores by sqrt(self.embed_dim), the model width, instead of sqrt(head_dim).

The wrapper builds it with the sizes of our params, copies our (in, out) weights
into its nn.Linear layers (weight = w.T) and calls forward. What the class cannot
express raises NotImplementedError.

Notebook state: ``__init__`` reads ``self.embed_dim = embed_dim`` from the
notebook's *global* ``embed_dim`` (set to 9 in the same cell before the class is
instantiated), not from its ``embedding_dimension`` argument. The wrapper
reproduces that state by setting this module's global ``embed_dim`` to the query
width before constructing the module.
"""
import torch
import torch.nn as nn

BUG = ("the looped MultiHeadAttention divides every head's scores by sqrt(self.embed_dim), "
       "the model width E, instead of sqrt(head_dim) = sqrt(E / num_heads).")
SOURCE = ("000_ef9a8195ca3d79bb.txt, In [36] MultiHeadAttention.forward: "
          "similarity = (q @ k.transpose(1,2)) / (self.embed_dim ** 0.5)")
EXPECTED_CLAUSES = frozenset({"mha.scale-head-dim"})
ARRAY = "torch"
DTYPES = ("float32", "float64")

embed_dim = 9  # the notebook global the class reads (In [36] sets embed_dim = 9); reset per call below


# ----------------------------------------------------------------- In [36], verbatim
class MultiHeadAttention(nn.Module):
    def __init__(self, embedding_dimension, num_heads):
        super().__init__()

        ### Make sure Embedding Dimension is Divisible by Num Heads ###
        assert embedding_dimension % num_heads == 0, f"Make sure your embed_dim {embedding_dimension} is divisible by the number of heads {num_heads}"

        self.embed_dim = embed_dim
        self.num_heads = num_heads

        ### Compute Head Dimension ###
        self.head_dim = self.embed_dim // self.num_heads


        ### Create a List of Lists which has all our Q,K,V projections for each head ###
        self.multihead_qkv = nn.ModuleList()

        ### For head Head create the QKV ###
        for head in range(self.num_heads):

            ### Create a dictionary of the 3 projection  layers we need ###
            qkv_proj = nn.ModuleDict(
                [
                    ["Q", nn.Linear(self.embed_dim, self.head_dim)],
                    ["K", nn.Linear(self.embed_dim, self.head_dim)],
                    ["V", nn.Linear(self.embed_dim, self.head_dim)],
                ]
            )

            ### Store Dictionary in List ###
            self.multihead_qkv.append(qkv_proj)

        ### Create final Projection layer, it will be applied to the concatenated heads will have shape embed_dim again ###
        self.head_mesh = nn.Linear(self.embed_dim, self.embed_dim)
        
    def forward(self, x):

        ### Create a list ot store each heads output ###
        head_outs = []
        
        ### Loop Through Each head of Attention ###
        for head in self.multihead_qkv:

            ### Access layers like a dictionary (ModuleDict) ###
            ### q,k,v will be (Batch x Seq len x head_dim)
            q = head["Q"](x)
            k = head["K"](x)
            v = head["V"](x)

            ### Now do the same Attention computation as before! ###
            similarity = (q @ k.transpose(1,2)) / (self.embed_dim ** 0.5)
            attention  = similarity.softmax(axis=-1)
            output = attention @ v

            ### Store this output in the head_outs ###
            head_outs.append(output)

        ### head_outs has num_heads tensors, each with the compressed embedding dimension of head_dim ###
        ### We can concatenate them all back together along the embedding dimension just like we did in the image above ###
        head_outs = torch.cat(head_outs, dim=-1)

        ### head_outs will have the same shape now as our input x! ###
        if head_outs.shape != x.shape:
            raise Exception("Something has gone wrong in the attention computation")

        ### Now each head was computed independently, we need them to get to know each other, so pass our head_outs through final projection ### 
        output = self.head_mesh(head_outs)

        return output
# ------------------------------------------------------------- end of the document's code


def _load(linear, w, b):
    """Our x @ w + b into nn.Linear (weight is (out, in)); a missing bias is zero."""
    linear.weight.copy_(w.T)
    if b is None:
        linear.bias.zero_()
    else:
        linear.bias.copy_(b)


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    global embed_dim
    p = {n: torch.as_tensor(t) for n, t in params.items() if t is not None}
    e = query.shape[-1]
    h = num_heads
    if mask is not None:
        raise NotImplementedError("In [36] MultiHeadAttention.forward(x) takes no mask")
    if is_causal:
        raise NotImplementedError("In [36] MultiHeadAttention has no causal mask")
    if not (torch.equal(key, query) and torch.equal(value, query)):
        raise NotImplementedError("In [36] MultiHeadAttention is self-attention only (forward(x))")
    if e % h or p["w_q"].shape[1] != e or p["w_v"].shape[1] != e or p["w_o"].shape != (e, e):
        raise NotImplementedError(
            "In [36] MultiHeadAttention needs head widths E / num_heads (w_q, w_k, w_v, w_o all (E, E))")
    embed_dim = e  # reproduce the notebook global that __init__ reads
    module = MultiHeadAttention(e, h).to(device=query.device, dtype=query.dtype).eval()
    d = e // h
    with torch.no_grad():
        for i, head in enumerate(module.multihead_qkv):
            cols = slice(i * d, (i + 1) * d)
            for name, w, b in (("Q", "w_q", "b_q"), ("K", "w_k", "b_k"), ("V", "w_v", "b_v")):
                _load(head[name], p[w][:, cols], p[b][cols] if b in p else None)
        _load(module.head_mesh, p["w_o"], p.get("b_o"))
    return module(query)

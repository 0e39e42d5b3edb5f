"""Broken (as written): 004_c2f71d5cd411389d.txt, 'Multi-Head Attention', In [72] (einsum multi-head block).

In [72] is a notebook cell, not a class: it reads the notebook globals B, T, C,
heads, retrieval_dims, value_dims (In [15], In [56]) and x, builds three
nn.Linear(C, dims * heads, bias=False) projections, splits heads with view,
computes ``wei = torch.einsum("bihk,bjhk->bhij", query, key)`` -- never scaled by
retrieval_dims ** -0.5, unlike the single-head cell In [57] --, fills the future
(tril(ones(T, T)) == 0) with -inf, softmaxes, and merges heads with einsum + view.
It has no output projection.

The cell's lines are copied verbatim into ``in_72`` below (indented into a
function whose arguments reproduce the notebook state: x = query, B, T, C from its
shape, heads = num_heads, retrieval_dims = Dk and value_dims = Dv from our params;
In [56] sets value_dims = retrieval_dims = C // heads, but the cell itself uses the
two names independently). One line is inserted, marked WRAPPER, right after the
projections are built: it moves them to the input dtype/device and copies our
(in, out) weights into them (weight = w.T). The cell's two trailing sanity-check
asserts are left out: they test the notebook's demo tensor, not the attention (and
the second raises for T = 1, where value[:, 1:] has no elements to view).

Wrapper steps outside the cell: the output of width heads * value_dims is passed
through our output projection as an explicit extra step, ``out @ w_o + b_o``
(the document has none). What the cell cannot express raises NotImplementedError:
a mask, is_causal=False (the cell is always causal), cross-attention (one x),
nonzero input biases (bias=False). The cell's causal mask is built on the CPU (as
the notebook's x was), so the member declares DEVICES = ("cpu",).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BUG = ("the einsum multi-head block never scales the scores: "
       "wei = torch.einsum('bihk,bjhk->bhij', query, key) goes to the softmax without retrieval_dims ** -0.5 "
       "(scale 1 instead of 1/sqrt(Dk)).")
SOURCE = ("004_c2f71d5cd411389d.txt, 'Multi-Head Attention', In [72]: "
          "wei = torch.einsum(\"bihk,bjhk->bhij\", query, key) is not scaled")
EXPECTED_CLAUSES = frozenset({"mha.scale-head-dim"})
ARRAY = "torch"
DTYPES = ("float32", "float64")
DEVICES = ("cpu",)  # the cell builds its causal mask with torch.ones((T, T)) on the CPU


def in_72(x, B, T, C, heads, retrieval_dims, value_dims, _load):
    """In [72], verbatim (indented), with the notebook globals as arguments."""
    # ----------------------------------------------------- In [72], verbatim
    # Project input to 8-d space for each head
    query_projection = nn.Linear(C, retrieval_dims * heads, bias=False)
    key_projection = nn.Linear(C, retrieval_dims * heads, bias=False)
    value_projection = nn.Linear(C, value_dims * heads, bias=False)
    _load(query_projection, key_projection, value_projection)  # WRAPPER (not in the cell): our weights

    query: torch.Tensor = query_projection(x)
    key: torch.Tensor = key_projection(x)
    value: torch.Tensor = value_projection(x)

    query = query.view(B, T, heads, retrieval_dims)
    key = key.view(B, T, heads, retrieval_dims)
    value = value.view(B, T, heads, value_dims)

    # Calculate attention weights
    wei = torch.einsum("bihk,bjhk->bhij", query, key)  # (B, heads, T, T)
    mask = torch.tril(torch.ones((T, T))) == 0
    wei = wei.masked_fill(mask, float("-inf"))
    wei = F.softmax(wei, dim=-1)  # (B, heads, T, T)

    # Calculate weighted value vectors
    # I wonder if there's a more efficient way to do this without needing to call .contiguous().
    # Does torch.compile take care of this for you?
    output = torch.einsum(
        "bhij,bjhc->bihc", wei, value
    ).contiguous()  # (B, T, heads, value_dims)

    # Concatenate value vectors
    output = output.view(B, T, heads * value_dims)

    return output  # WRAPPER: hand back the cell's result
# ------------------------------------------------------------- end of the document's code


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    p = {n: torch.as_tensor(t) for n, t in params.items() if t is not None}
    if mask is not None:
        raise NotImplementedError("004 In [72] takes no mask")
    if not is_causal:
        raise NotImplementedError("004 In [72] is always causal: is_causal=True only")
    if not (torch.equal(key, query) and torch.equal(value, query)):
        raise NotImplementedError("004 In [72] is self-attention only (one x)")
    if any(f"b_{n}" in p and bool(p[f"b_{n}"].ne(0).any()) for n in "qkv"):
        raise NotImplementedError("004 In [72] projections are nn.Linear(..., bias=False): no input biases")
    h = num_heads
    if p["w_q"].shape[1] % h or p["w_v"].shape[1] % h:
        raise NotImplementedError("projection widths must be multiples of num_heads")
    B, T, C = query.shape

    def load(query_projection, key_projection, value_projection):
        with torch.no_grad():
            for layer, w in ((query_projection, "w_q"), (key_projection, "w_k"), (value_projection, "w_v")):
                layer.to(device=query.device, dtype=query.dtype)  # nn.Module.to works in place
                layer.weight.copy_(p[w].T)

    output = in_72(query, B, T, C, h, p["w_q"].shape[1] // h, p["w_v"].shape[1] // h, load)
    # WRAPPER step, not in the document (it has no output projection): our x @ w_o + b_o.
    output = output @ p["w_o"]
    if "b_o" in p:
        output = output + p["b_o"]
    return output

"""Correct (as written, with a declared fully-masked-row policy): 003_58636e0047490b73.txt,
In [1] ``dot_product_attention`` and In [4] ``MultiHeadAttention``.

The function and class below are the document's, copied verbatim (their prints
only run with explain=True, which the wrapper never passes). Separate
q_linear / k_linear / v_linear of width dim_k * num_heads, view + transpose into
heads, scores / sqrt(dim_k), ``masked_fill(mask == 0, -1e9)`` after
``mask.unsqueeze(1)``, softmax, transpose back, ``out`` projection to emb_dim. It
returns (output, scores); the wrapper returns output.

The wrapper builds MultiHeadAttention(num_heads, emb_dim=E, dim_k=Dk, dropout=0.0)
and calls forward(query, key, value, mask) with our (in, out) weights as its nn.Linear
layers' parameters (weight = w.T, missing biases zero; torch.func.functional_call, so
that autograd reaches our weights).

Masks: the document's mask is boolean with True = keep, given as (B, 1, Lk) for a
source (key padding) mask or (B, Lq, Lk) for a target mask, and unsqueezed to
(B, 1, 1, Lk) / (B, 1, Lq, Lk) to broadcast over the heads ('Masks and Softmax').
The wrapper passes our bool mask in that form (any bool mask without a per-head
axis: (Lq, Lk), (B, 1, 1, Lk), (B, 1, Lq, Lk), ...), and is_causal as the
document's decoder target mask (tril of ones, top-left), intersected with the
explicit mask. Float (additive) masks, per-head masks, Dv != Dk and E_kv != E
cannot be expressed and raise NotImplementedError.

Fully masked rows: the -1e9 fill makes such a row's softmax uniform, so it yields the
mean of v over all keys; the document does not say so, the member declares it
(FULLY_MASKED_ROWS = {"bool": "uniform"}).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BUG = "none"
SOURCE = ("003_58636e0047490b73.txt, In [1] dot_product_attention and In [4] MultiHeadAttention "
          "(copied verbatim, wrapped); fully masked rows declared 'uniform' (-1e9 fill)")
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float32", "float64")
FULLY_MASKED_ROWS = {"bool": "uniform"}


# ----------------------------------------------------------------- In [1], verbatim
def dot_product_attention(
    q, k, v, dim, 
    mask=None, dropout=None, explain=False
    ):

    ''' Function that performs scaled dot product attention on
    tensors Q, K and V. each of shape:
    
    (batch_size, num_heads, sequence_length, dim)
    
    where k and v are expected to have the same sequence_length
    but q and k do not need to have the same sequence length.
    
    matrix multiplication is done using the last two dimensions of 
    the input tensors:
    
    (batch_size, num_heads, q_seq_len, dim) 
    X 
    (batch_size, num_heads, dim, k_seq_len)
    = 
    (batch_size, num_heads, q_seq_len, k_seq_len)
    '''

    k = k.transpose(-2, -1) 

    if explain: print('q, k', q.shape, k.shape)

    scores = torch.matmul(q, k) / math.sqrt(dim)  

    if explain: print('scores.shape', scores.shape)

    if mask is not None:

        mask = mask.unsqueeze(1)
        if explain: print('mask.shape', mask.shape)
        scores = scores.masked_fill(mask == 0, -1e9) 

    softscores = F.softmax(scores, dim=-1)

    if dropout is not None: softscores = dropout(softscores)

    #(batch_size,num_heads,q_seq_len, k_seq_len)
    #X
    #(batch_size,num_heads,v_seq_len,dim_v)
    
    output = torch.matmul(softscores, v)

    # output (batch_size, num_heads, q_seq_len, dim_v)
    return output, scores 
# ----------------------------------------------------------------- In [4], verbatim
class MultiHeadAttention(nn.Module):
    
    def __init__(self, num_heads, emb_dim, dim_k = None, dropout = 0.1):
        
        super().__init__()
        
        self.emb_dim = emb_dim
        self.dim_k = dim_k if dim_k else emb_dim // num_heads
        self.num_heads = num_heads
        self.q_linear = nn.Linear(emb_dim,self.dim_k*num_heads)
        self.k_linear = nn.Linear(emb_dim,self.dim_k*num_heads)
        self.v_linear = nn.Linear(emb_dim,self.dim_k*num_heads)

        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(self.dim_k*num_heads,emb_dim)
    
    def forward(self, q, k, v, mask=None, explain=False):
        '''
        inputs:
            q has shape (batch size, q_sequence length, embedding dimensions)
            k,v are shape (batch size, kv_sequence length, embedding dimensions)
            source_mask of shape (batch size, 1, kv_sequence length)
            
        outputs: sequence of vectors, re-represented using attention
            shape (batch size, q_sequence length, embedding dimensions)
        use:
            The encoder layer places the same source vector sequence into q, k, v 
            and source_mask into mask.
            
            The decoder layer uses this twice, once with decoder inputs as q, k, v 
            and target mask as mask. then with decoder inputs as q, encoder outputs
            as k, v and source mask as mask
        '''
        # k,q,v are each shape (batch size, sequence length, dim_k * num_heads)
        
        batch_size = q.size(0)
        
        q = self.q_linear(q)
        k = self.k_linear(k)
        v = self.v_linear(v)
        
        if explain: print("(batch size, sequence length, dim_k * num_heads)", k.shape)
            
        # k,q,v are each shape (batch size, sequence length, num_heads, dim_k)
        
        k = k.view(batch_size, -1, self.num_heads, self.dim_k)
        q = q.view(batch_size, -1, self.num_heads, self.dim_k)
        v = v.view(batch_size, -1, self.num_heads, self.dim_k)
        
        # transpose to shape (batch_size, num_heads, sequence length, dim_k)
        
        k = k.transpose(1,2)
        q = q.transpose(1,2)
        v = v.transpose(1,2)
        
        if explain: print("(batch_size,num_heads,qk_seq_length,dim_k)", k.shape)
        if explain: print("(batch_size,num_heads,v_seq_length,dim_k)", v.shape)
            
        # calculate attention using function we will define next
        
        attn, scores = dot_product_attention(q, k, v, self.dim_k, mask, self.dropout, explain)
        
        if explain: print("attn(batch_size,num_heads,seq_length,dim_k)", attn.shape)
            
        # concatenate heads, dim_k = dim_v 
        
        concat = attn.transpose(1,2).contiguous().view(batch_size,-1,self.dim_k*self.num_heads)
        
        if explain: print("concat.shape", concat.shape)
            
        # put through final linear layer
        
        output = self.out(concat)
        
        if explain: print("MultiHeadAttention output.shape", output.shape)
            
        return output, scores
# ------------------------------------------------------------- end of the document's code


def _weights(p: dict, device, dtype) -> dict:
    """Our x @ w + b as the parameters of the module's nn.Linear layers (weight is (out, in); a missing bias is zero),
    by name, for torch.func.functional_call: the module's forward runs on our tensors, so autograd reaches them (the
    gradient tests differentiate the contract's params, as training its layers')."""
    weights = {}
    for layer, n in (("q_linear", "q"), ("k_linear", "k"), ("v_linear", "v"), ("out", "o")):
        w, b = p[f"w_{n}"], p.get(f"b_{n}")
        weights[f"{layer}.weight"] = w.T
        weights[f"{layer}.bias"] = torch.zeros(w.shape[1], device=device, dtype=dtype) if b is None else b
    return weights


def _document_mask(mask, is_causal, lq, lk, device):
    """Our mask (True = attend, broadcast to (B, H, Lq, Lk)) and causal flag as the document's
    mask m (True = keep) with m.unsqueeze(1) broadcasting to the scores; None if neither."""
    keep = None
    if mask is not None:
        mask = torch.as_tensor(mask)
        if mask.dtype != torch.bool:
            raise NotImplementedError(
                "003 dot_product_attention reads a mask as keep/drop (masked_fill(mask == 0, -1e9)), "
                "not as additive float scores")
        if mask.dim() > 4:
            raise NotImplementedError("003 masks are at most (B, 1, Lq, Lk) after unsqueeze(1)")
        full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        if full.shape[1] != 1:
            raise NotImplementedError("003 masks are unsqueezed over the heads: no per-head mask")
        keep = full[:, 0]  # (B or 1, Lq or 1, Lk or 1): unsqueeze(1) gives it back
    if is_causal:
        causal = torch.ones((lq, lk), dtype=torch.bool, device=device).tril()[None]  # decoder target mask
        keep = causal if keep is None else keep & causal
    return keep


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    p = {n: torch.as_tensor(t) for n, t in params.items() if t is not None}
    e = query.shape[-1]
    h = num_heads
    if key.shape[-1] != e or value.shape[-1] != e:
        raise NotImplementedError("003 MultiHeadAttention projects k and v with Linear(emb_dim, ...): E_kv must be E")
    if p["w_q"].shape[1] % h or p["w_v"].shape[1] != p["w_q"].shape[1]:
        raise NotImplementedError("003 MultiHeadAttention uses dim_k for the values too: Dv must equal Dk")
    if p["w_o"].shape[1] != e:
        raise NotImplementedError("003 MultiHeadAttention's out layer is Linear(dim_k * num_heads, emb_dim): "
                                  "output width must be E")
    doc_mask = _document_mask(mask, is_causal, query.shape[-2], key.shape[-2], query.device)
    module = MultiHeadAttention(num_heads=h, emb_dim=e, dim_k=p["w_q"].shape[1] // h, dropout=0.0)
    module = module.to(device=query.device, dtype=query.dtype).eval()
    output, scores = torch.func.functional_call(module, _weights(p, query.device, query.dtype),
                                                (query, key, value, doc_mask))
    return output

"""Correct (as written): 000_ef9a8195ca3d79bb.txt, In [59], ``SelfAttentionEncoder``.

The class below is the document's, copied verbatim: packed q/k/v projections,
reshape/transpose into heads, scale head_dim ** -0.5, transpose back before the
merge, output projection. The wrapper builds it with the sizes of our params
(dropouts 0) and calls its forward with our (in, out) weights as its nn.Linear
layers' parameters (weight = w.T, missing biases zero; torch.func.functional_call,
so that autograd reaches our weights).

It can only express self-attention without mask or causal flag, with head widths
E / num_heads (every projection (E, E)); anything else raises NotImplementedError.
"""
import torch
import torch.nn as nn

from zoo.correct_docs_000_self_attention_causal import module_weights  # the same nn.Linear layers

BUG = "none"
SOURCE = "000_ef9a8195ca3d79bb.txt, In [59] SelfAttentionEncoder (copied verbatim, wrapped)"
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float32", "float64")


# ----------------------------------------------------------------- In [59], verbatim
class SelfAttentionEncoder(nn.Module):
    """
    Self Attention Proposed in `Attention is All  You Need` - https://arxiv.org/abs/1706.03762
    """
    
    def __init__(self,
               embed_dim=768,
               num_heads=12, 
               attn_p=0,
               proj_p=0):
        """
        
        Args:
            embed_dim: Transformer Embedding Dimension
            num_heads: Number of heads of computation for Attention 
            attn_p: Probability for Dropout2d on Attention cube
            proj_p: Probability for Dropout on final Projection
        """
        
        super(SelfAttentionEncoder, self).__init__()

        ### Make Sure Embed Dim is Divisible by Num Heads ###
        assert embed_dim % num_heads == 0
        self.num_heads = num_heads
        self.head_dim = int(embed_dim / num_heads)
        
        ### Define all our Projections ###
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.attn_drop = nn.Dropout(attn_p)

        ### Define Post Attention Projection ###
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.proj_drop = nn.Dropout(proj_p)
        
    def forward(self, x):
        
        batch, seq_len, embed_dim = x.shape

        ### Compute Q, K, V Projections,and Reshape/Permute to [Batch x Num Heads x Seq Len x Head Dim] 
        q = self.q_proj(x).reshape(batch, seq_len, self.num_heads, self.head_dim).transpose(1,2).contiguous()
        k = self.k_proj(x).reshape(batch, seq_len, self.num_heads, self.head_dim).transpose(1,2).contiguous()
        v = self.v_proj(x).reshape(batch, seq_len, self.num_heads, self.head_dim).transpose(1,2).contiguous()
        
        ### Perform Attention Computation ###
        attn = (q @ k.transpose(-2,-1)) * (self.head_dim ** -0.5)
        attn = attn.softmax(dim=-1)
        attn = self.attn_drop(attn)
        x = attn @ v
        
        ### Bring Back to [Batch x Seq Len x Embed Dim] ###
        x = x.transpose(1,2).reshape(batch, seq_len, embed_dim)

        ### Pass through Projection so Heads get to know each other ###
        x = self.proj(x)
        x = self.proj_drop(x)
        
        return x
# ------------------------------------------------------------- end of the document's code


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    p = {n: torch.as_tensor(t) for n, t in params.items() if t is not None}
    e = query.shape[-1]
    if mask is not None:
        raise NotImplementedError("In [59] SelfAttentionEncoder.forward(x) takes no mask")
    if is_causal:
        raise NotImplementedError("In [59] SelfAttentionEncoder has no causal mask")
    if not (torch.equal(key, query) and torch.equal(value, query)):
        raise NotImplementedError("In [59] SelfAttentionEncoder is self-attention only (forward(x))")
    if e % num_heads or any(p[w].shape != (e, e) for w in ("w_q", "w_k", "w_v", "w_o")):
        raise NotImplementedError(
            "In [59] SelfAttentionEncoder needs head widths E / num_heads (w_q, w_k, w_v, w_o all (E, E))")
    module = SelfAttentionEncoder(e, num_heads, attn_p=0, proj_p=0).to(device=query.device, dtype=query.dtype)
    module.eval()
    return torch.func.functional_call(module, module_weights(p, query.device, query.dtype), (query,))

"""Correct (as written): 000_ef9a8195ca3d79bb.txt, In [64], ``SelfAttention(causal=True)``.

The class below is the document's, copied verbatim: In [59]'s SelfAttentionEncoder
plus a registered (1, 1, seq_len, seq_len) tril buffer whose zeros fill the scores
with -inf before the softmax. The wrapper builds it with causal=True, dropouts 0
and a buffer of max(512, Lq) positions (512 is the class default) and calls its
forward with our (in, out) weights as its nn.Linear layers' parameters (weight =
w.T, missing biases zero; torch.func.functional_call, so that autograd reaches
our weights).

It can only express causal self-attention (is_causal=True, the document's use)
without an explicit mask, with head widths E / num_heads (every projection
(E, E)); anything else raises NotImplementedError.
"""
import torch
import torch.nn as nn

BUG = "none"
SOURCE = "000_ef9a8195ca3d79bb.txt, In [64] SelfAttention(causal=True) (copied verbatim, wrapped)"
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float32", "float64")


# ----------------------------------------------------------------- In [64], verbatim
class SelfAttention(nn.Module):
    """
    Self Attention Proposed in `Attention is All  You Need` - https://arxiv.org/abs/1706.03762
    """
    
    def __init__(self,
               embed_dim=768,
               num_heads=12, 
               attn_p=0,
               proj_p=0,
               causal=True, 
               seq_len=512):
        """
        
        Args:
            embed_dim: Transformer Embedding Dimension
            num_heads: Number of heads of computation for Attention 
            attn_p: Probability for Dropout2d on Attention cube
            proj_p: Probability for Dropout on final Projection
            causal: Do you want to apply a causal mask?
            seq_len: What is the max sequence length this model can expect?
        """
        
        super(SelfAttention, self).__init__()

        ### Make Sure Embed Dim is Divisible by Num Heads ###
        assert embed_dim % num_heads == 0
        self.num_heads = num_heads
        self.head_dim = int(embed_dim / num_heads)
        self.causal = causal
        
        ### Define all our Projections ###
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.attn_drop = nn.Dropout(attn_p)

        ### Define Post Attention Projection ###
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.proj_drop = nn.Dropout(proj_p)

        ### Create NonLearnable Buffer to Act as our Causal Mask ###
        if causal:

            ### Create a Seq_Len x Seq_Len tensor full of Ones
            ones = torch.ones((seq_len, seq_len))

            ### Fill Top right triangle with Zeros (as we dont want to attend to them) ###
            causal_mask = torch.tril(ones) 

            ### Add extra dimensions for Batch size and Number of Heads ###
            causal_mask = causal_mask.reshape(1,1,seq_len,seq_len).bool()

            ### Store as a Buffer, as these parameters dont need to be learned ###
            self.register_buffer("causal_mask", causal_mask.to(torch.bool))
        
        
    def forward(self, x):
        
        batch, seq_len, embed_dim = x.shape

        ### Compute Q, K, V Projections,and Reshape/Permute to [Batch x Num Heads x Seq Len x Head Dim] 
        q = self.q_proj(x).reshape(batch, seq_len, self.num_heads, self.head_dim).transpose(1,2).contiguous()
        k = self.k_proj(x).reshape(batch, seq_len, self.num_heads, self.head_dim).transpose(1,2).contiguous()
        v = self.v_proj(x).reshape(batch, seq_len, self.num_heads, self.head_dim).transpose(1,2).contiguous()
        
        ### Perform Attention Computation ###
        attn = (q @ k.transpose(-2,-1)) * (self.head_dim ** -0.5)

        if self.causal:
            ####################################################################################
            ### FILL ATTENTION MASK WITH -Infinity ###
            attn = attn.masked_fill(self.causal_mask[:,:,:seq_len,:seq_len] == 0, float('-inf'))
            ####################################################################################
    
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


def module_weights(p: dict, device, dtype) -> dict:
    """Our x @ w + b as the parameters of the module's nn.Linear layers (weight is (out, in); a missing bias is zero),
    by name, for torch.func.functional_call: the module's forward runs on our tensors, so autograd reaches them (the
    gradient tests differentiate the contract's params, as training its layers')."""
    weights = {}
    for layer, n in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("proj", "o")):
        w, b = p[f"w_{n}"], p.get(f"b_{n}")
        weights[f"{layer}.weight"] = w.T
        weights[f"{layer}.bias"] = torch.zeros(w.shape[1], device=device, dtype=dtype) if b is None else b
    return weights


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    p = {n: torch.as_tensor(t) for n, t in params.items() if t is not None}
    e, lq = query.shape[-1], query.shape[-2]
    if mask is not None:
        raise NotImplementedError("In [64] SelfAttention.forward(x) takes no mask")
    if not is_causal:
        raise NotImplementedError("wrapped as in the document, SelfAttention(causal=True): is_causal=True only")
    if not (torch.equal(key, query) and torch.equal(value, query)):
        raise NotImplementedError("In [64] SelfAttention is self-attention only (forward(x))")
    if e % num_heads or any(p[w].shape != (e, e) for w in ("w_q", "w_k", "w_v", "w_o")):
        raise NotImplementedError(
            "In [64] SelfAttention needs head widths E / num_heads (w_q, w_k, w_v, w_o all (E, E))")
    module = SelfAttention(e, num_heads, attn_p=0, proj_p=0, causal=True, seq_len=max(512, lq))
    module = module.to(device=query.device, dtype=query.dtype).eval()
    return torch.func.functional_call(module, module_weights(p, query.device, query.dtype), (query,))

"""Correct: torch implementation (ARRAY = "torch"), computing in the input dtype.

Takes and returns torch tensors. Written with plain torch ops (matmul,
softmax, repeat_interleave, masked_fill), not torch's fused SDPA, so the
member is independent of which SDPA backend the installed torch picks.
Fully masked rows are zeroed explicitly (torch.softmax would give NaN).
"""
import math

import torch

BUG = "none"
SOURCE = "torch ops, following the torch.nn.functional.scaled_dot_product_attention reference code"
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float64", "float32", "float16", "bfloat16")


def softmax(x, axis=-1):
    x = torch.as_tensor(x)
    dead = torch.isneginf(x).all(dim=axis, keepdim=True)  # all -inf slice -> zeros
    # The softmax of a dead slice is taken of zeros, not of -inf: softmax(-inf, ...) is NaN, and though the forward
    # fills it with 0, its backward would carry the NaN into every gradient (PyTorch issue #41508).
    return torch.softmax(x.masked_fill(dead, 0), dim=axis).masked_fill(dead, 0)


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q, k, v = torch.as_tensor(q), torch.as_tensor(k), torch.as_tensor(v)
    hq, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or hq % hkv or v.shape[1] != hkv:
        raise ValueError("incompatible q/k/v shapes")
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    lq, lk = q.shape[-2], k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q * scale) @ k.transpose(-2, -1)  # q scaled first: q @ k^T may pass float16's range
    full = scores.shape
    if mask is not None:
        m = torch.as_tensor(mask)
        if m.dtype == torch.bool:
            scores = scores.masked_fill(~m.broadcast_to(full), float("-inf"))
        else:
            scores = scores + m.to(scores.dtype).broadcast_to(full)
    if is_causal:
        keep = torch.ones(lq, lk, dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = softmax(scores, axis=-1)
    return (weights @ v).to(q.dtype)


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    query, key, value = (torch.as_tensor(a) for a in (query, key, value))
    p = {n: torch.as_tensor(t) for n, t in params.items() if t is not None}

    def proj(x, w, b):
        y = x @ p[w]
        return y + p[b] if b in p else y

    def split(x):  # (B, L, H*D) -> (B, H, L, D)
        b, l, f = x.shape
        return x.reshape(b, l, num_heads, f // num_heads).transpose(1, 2)

    if p["w_q"].shape[1] % num_heads or p["w_v"].shape[1] % num_heads:
        raise ValueError("projection widths must be multiples of num_heads")
    q = split(proj(query, "w_q", "b_q"))
    k = split(proj(key, "w_k", "b_k"))
    v = split(proj(value, "w_v", "b_v"))
    o = sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=1.0 / math.sqrt(q.shape[-1]))
    b, h, lq, dv = o.shape
    merged = o.transpose(1, 2).reshape(b, lq, h * dv)
    return proj(merged, "w_o", "b_o").to(query.dtype)

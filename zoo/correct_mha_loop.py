"""Correct: multi_head_attention that loops over heads, built on correct_loop.sdpa.

Each head slices its own columns of the projections, runs the loop sdpa on a
(B, 1, L, D) problem with its slice of the broadcast mask, and the head outputs
are concatenated with np.concatenate in head order.
"""
import math

import numpy as np

from zoo import correct_loop

BUG = "none"
SOURCE = "per-head loop with column slices (000_ef9a8195ca3d79bb.txt In [36], minus its sqrt(embed_dim) bug)"
EXPECTED_CLAUSES = frozenset()


def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
    dtype = np.asarray(query).dtype
    f64 = lambda a: np.asarray(a).astype(np.float64)  # noqa: E731
    x_q, x_k, x_v = f64(query), f64(key), f64(value)
    w_q, w_k, w_v, w_o = (f64(params[n]) for n in ("w_q", "w_k", "w_v", "w_o"))
    zero = lambda w: np.zeros(w.shape[1])  # noqa: E731
    b_q, b_k, b_v, b_o = (f64(params[n]) if params.get(n) is not None else zero(w)
                          for n, w in (("b_q", w_q), ("b_k", w_k), ("b_v", w_v), ("b_o", w_o)))
    dk = w_q.shape[1] // num_heads
    dv = w_v.shape[1] // num_heads
    if w_q.shape[1] != num_heads * dk or w_k.shape[1] != w_q.shape[1] or w_v.shape[1] != num_heads * dv:
        raise ValueError("projection widths must be num_heads * head width")
    b, lq, lk = x_q.shape[0], x_q.shape[1], x_k.shape[1]
    full_mask = None if mask is None else np.broadcast_to(np.asarray(mask), (b, num_heads, lq, lk))
    heads = []
    for h in range(num_heads):
        cq = slice(h * dk, (h + 1) * dk)
        cv = slice(h * dv, (h + 1) * dv)
        qh = (x_q @ w_q[:, cq] + b_q[cq])[:, None]  # (B, 1, Lq, Dk)
        kh = (x_k @ w_k[:, cq] + b_k[cq])[:, None]
        vh = (x_v @ w_v[:, cv] + b_v[cv])[:, None]
        mh = None if full_mask is None else full_mask[:, h:h + 1]
        o = correct_loop.sdpa(qh, kh, vh, mask=mh, is_causal=is_causal, scale=1.0 / math.sqrt(dk))
        heads.append(o[:, 0])
    merged = np.concatenate(heads, axis=-1)  # (B, Lq, H*Dv), head order
    return (merged @ w_o + b_o).astype(dtype)

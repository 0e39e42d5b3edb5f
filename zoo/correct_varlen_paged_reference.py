"""Correct: packed variable-length batches (sdpa_varlen) and paged KV caches (sdpa_paged), sequence by sequence.

Written from the contract (README "The contract"; spec/clauses.yaml varlen.*, paged.*), not from the oracle: a loop
over the sequences, each one's queries and keys cut out of the packed tensors (or gathered page by page from the
cache), positions within the sequence, bottom-right by default, the window, softcap, ALiBi and the learnable sink in
the order of sdpa.variant-order; float64 throughout, cast back to q's dtype. The broken varlen and paged members
(zoo/broken_varlen_*.py, broken_paged_*.py) call ``varlen`` / ``paged`` with one step replaced (marked # BUG).
"""
from __future__ import annotations

import numpy as np

from zoo import _reference as ref
from zoo import correct_sink_chunk_leftpad_reference as sinks
from zoo import correct_variants_reference as variants

BUG = "none"
SOURCE = "README 'The contract' (sdpa_varlen, sdpa_paged); spec/clauses.yaml varlen.*, paged.*"
EXPECTED_CLAUSES = frozenset()
DTYPES = ("float64", "float32", "float16", "bfloat16")


def spans(cu_seqlens_q, cu_seqlens_k, seqused_k):
    """(query start, query end, key start, key end) per sequence: offsets, the used keys first."""
    cq, ck = np.asarray(cu_seqlens_q).astype(np.int64), np.asarray(cu_seqlens_k).astype(np.int64)
    out = []
    for b in range(len(cq) - 1):
        used = ck[b + 1] - ck[b] if seqused_k is None else int(np.asarray(seqused_k)[b])
        out.append((int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b]) + int(used)))
    return out


def page_slots(block_table_row, used: int, block_size: int):
    """(page, slot) of each of a sequence's first ``used`` keys: key j in page table[j // block_size], slot j % ..."""
    return [(int(block_table_row[j // block_size]), j % block_size) for j in range(used)]


def query_positions(lq: int, lk: int, alignment: str) -> np.ndarray:
    """Query row i of a sequence at i + lk - lq (bottom-right) or i (top-left)."""
    return np.arange(lq) + (lk - lq if alignment == "bottom-right" else 0)


def keep_keys(positions: np.ndarray, lk: int, is_causal: bool, window) -> np.ndarray:
    """(lq, lk): the causal band and the window at these query positions (keys at 0 .. lk - 1)."""
    p, j = positions[:, None], np.arange(lk)[None, :]
    keep = np.ones((len(positions), lk), dtype=bool)
    if is_causal:
        keep &= j <= p
    if window is not None:
        left, right = window
        if left is not None:
            keep &= j >= p - int(left)
        if right is not None:
            keep &= j <= p + int(right)
    return keep


STEPS = {"spans": spans, "page_slots": page_slots, "query_positions": query_positions, "keep_keys": keep_keys}


def one_sequence(q, k, v, example, scale, is_causal, window, softcap, alibi_slopes, learnable_sink, alignment,
                 step) -> np.ndarray:
    """sdpa of one sequence: q (Lq, Hq, Dk), k (Lk, Hkv, Dk), v (Lk, Hkv, Dv) in float64 -> (Lq, Hq, Dv)."""
    lq, hq, lk = q.shape[0], q.shape[1], k.shape[0]
    if lq == 0 or lk == 0:
        return np.zeros((lq, hq, v.shape[2]))  # no rows, or rows without a key: 0 (with a sink too)
    group = hq // k.shape[1]
    kh, vh = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("qhd,khd->hqk", q, kh) * float(scale)
    if softcap is not None:
        s = variants.capped(s, float(softcap))
    positions = step["query_positions"](lq, lk, alignment)
    if alibi_slopes is not None:
        slopes = ref.as64(alibi_slopes)
        slopes = slopes[example] if slopes.ndim == 2 else slopes
        s = s - slopes[:, None, None] * np.abs(positions[:, None] - np.arange(lk)[None, :])[None]
    s = np.where(step["keep_keys"](positions, lk, is_causal, window)[None], s, -np.inf)
    if learnable_sink is None:
        weights = ref.masked_softmax(s, axis=-1)
    else:
        weights = sinks.sink_weights(s[None], ref.as64(learnable_sink).reshape(1, hq, 1, 1))[0]
    return np.einsum("hqk,khd->qhd", weights, vh)


def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal=False, scale=None, seqused_k=None, window=None,
           softcap=None, alibi_slopes=None, learnable_sink=None, alignment="bottom-right", **steps):
    """sdpa_varlen; ``steps`` replaces a step of STEPS by name (a broken member's one change)."""
    step = {**STEPS, **steps}
    q64, k64, v64 = ref.as64(q), ref.as64(k), ref.as64(v)
    scale = ref.default_scale(q64.shape[-1]) if scale is None else scale
    out = np.zeros(q64.shape[:2] + (v64.shape[2],))
    for b, (qs, qe, ks, ke) in enumerate(step["spans"](cu_seqlens_q, cu_seqlens_k, seqused_k)):
        out[qs:qe] = one_sequence(q64[qs:qe], k64[ks:ke], v64[ks:ke], b, scale, is_causal, window, softcap,
                                  alibi_slopes, learnable_sink, alignment, step)
    return out.astype(ref.out_dtype(q))


def paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, window=None, softcap=None,
          alibi_slopes=None, learnable_sink=None, alignment="bottom-right", **steps):
    """sdpa_paged, q (B, Hq, Lq, Dk); ``steps`` as for ``varlen``."""
    step = {**STEPS, **steps}
    q64, kc, vc = ref.as64(q), ref.as64(k_cache), ref.as64(v_cache)
    scale = ref.default_scale(q64.shape[-1]) if scale is None else scale
    table = np.asarray(block_table).astype(np.int64)
    out = np.zeros(q64.shape[:3] + (vc.shape[3],))
    for b in range(q64.shape[0]):
        slots = step["page_slots"](table[b], int(np.asarray(seqused_k)[b]), kc.shape[1])
        k = np.stack([kc[page, slot] for page, slot in slots]) if slots else np.zeros((0,) + kc.shape[2:])
        v = np.stack([vc[page, slot] for page, slot in slots]) if slots else np.zeros((0,) + vc.shape[2:])
        out[b] = np.swapaxes(one_sequence(np.swapaxes(q64[b], 0, 1), k, v, b, scale, is_causal, window, softcap,
                                          alibi_slopes, learnable_sink, alignment, step), 0, 1)
    return out.astype(ref.out_dtype(q))


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
    return varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, seqused_k, window, softcap, alibi_slopes,
                  learnable_sink)


def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
               softcap=None, alibi_slopes=None, learnable_sink=None):
    return paged(q, k_cache, v_cache, block_table, seqused_k, is_causal, scale, window, softcap, alibi_slopes,
                 learnable_sink)

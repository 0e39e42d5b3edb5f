"""Helpers several frameworks' built-ins share: host copies of small arrays, the positions a packed or paged
batch's rows sit at and the keys they keep (document masks), pages gathered, ALiBi slopes and sink logits in
broadcasting shapes, heads split and merged, multi_head_attention around any sdpa, and the variant keywords a call
passes.
"""
from __future__ import annotations

import numpy as np

ALL_DTYPES = ("float64", "float32", "float16", "bfloat16")


def host_ints(x) -> np.ndarray:
    """Per-example lengths as NumPy ints (they are structure: which keys exist, not data)."""
    return np.asarray(x.cpu() if hasattr(x, "cpu") else x).astype(np.int64)


def distance_matrix(lq: int, lk: int, query_offset: int) -> np.ndarray:
    """(lq, lk): |p_i - j|, query i at position query_offset + i, key j at j (ALiBi's distance)."""
    return np.abs((query_offset + np.arange(lq))[:, None] - np.arange(lk)[None, :])


def positions_allowed(lq, lk, is_causal=False, window=None, query_offset=0, key_lengths=None, *,
                       sink_token_length=0, attention_chunk=None, key_leftpad=None) -> np.ndarray:
    """(B or 1, 1, lq, lk) boolean: the spec's key set (oracle.positions_allowed), key lengths and left paddings
    read off the device.

    Every built-in that has no native window, offset, chunk, padding or length option builds its mask from here:
    the position rule is the contract's, not the framework's, so it is written once."""
    from attention_conformance.conformance.reference import oracle

    lengths = None if key_lengths is None else host_ints(key_lengths)
    leftpad = None if key_leftpad is None else host_ints(key_leftpad)
    return oracle.positions_allowed(lq, lk, is_causal, window, query_offset, lengths,
                                    sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                                    key_leftpad=leftpad)


# ------------------------------------------------------------------ packed and paged batches
# sdpa_varlen and sdpa_paged (docs/contract.md). The built-ins compute them as document masking does (flex's
# idiom; what FlashAttention's kernels do tile by tile): one attention over every packed query row and key row,
# keeping a key only for a query of its own sequence, at the positions SEQUENCE_ALIGNMENT gives; not sequence by
# sequence as the oracle defines them, so the suite compares two formulations. Sequence structure (offsets, used
# lengths, block tables) is read on the host, as kernels read it before launch.
def packed_positions(cu_seqlens_q, cu_seqlens_k, seqused_k=None, alignment: str = "bottom-right"):
    """(query sequence, query position, key sequence, key position, key used) per packed row: query row t of
    sequence b sits at t - cu_seqlens_q[b] + (Lk_b - Lq_b) bottom-right (+ 0 top-left), key row s at s -
    cu_seqlens_k[b]; a key is used while its position is below seqused_k[b] (all of the sequence's without it)."""
    starts_q, starts_k = host_ints(cu_seqlens_q).reshape(-1), host_ints(cu_seqlens_k).reshape(-1)
    rows_q, rows_k = np.arange(starts_q[-1]), np.arange(starts_k[-1])
    query_seq = np.searchsorted(starts_q, rows_q, side="right") - 1
    key_seq = np.searchsorted(starts_k, rows_k, side="right") - 1
    keys = np.diff(starts_k) if seqused_k is None else host_ints(seqused_k).reshape(-1)
    offset = keys - np.diff(starts_q) if alignment == "bottom-right" else np.zeros_like(keys)
    key_position = rows_k - starts_k[key_seq]
    return (query_seq, rows_q - starts_q[query_seq] + offset[query_seq], key_seq, key_position,
            key_position < keys[key_seq])


def sequence_keep(query_position, key_position, is_causal: bool, window) -> np.ndarray:
    """The causal band and the window of positions (any broadcastable shapes): which keys a query keeps."""
    keep = np.ones(np.broadcast_shapes(np.shape(query_position), np.shape(key_position)), dtype=bool)
    if is_causal:
        keep &= key_position <= query_position
    left, right = window if window is not None else (None, None)
    if left is not None:
        keep &= key_position >= query_position - int(left)
    if right is not None:
        keep &= key_position <= query_position + int(right)
    return keep


def document_mask(cu_seqlens_q, cu_seqlens_k, seqused_k, is_causal, window, alibi_slopes, hq: int,
                   alignment: str = "bottom-right") -> np.ndarray:
    """sdpa_varlen as one sdpa mask over the packed rows, (1, 1, total_q, total_k) boolean, or with ALiBi (1, Hq,
    total_q, total_k) float64: -slope[b, h] * |position distance| on the kept keys, -inf elsewhere (ALiBi comes
    after softcap in sdpa.variant-order, as a float mask does)."""
    query_seq, query_position, key_seq, key_position, used = packed_positions(cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                                              alignment)
    keep = (query_seq[:, None] == key_seq[None, :]) & used[None, :] \
        & sequence_keep(query_position[:, None], key_position[None, :], is_causal, window)
    if alibi_slopes is None:
        return keep[None, None]
    slopes = host_floats(alibi_slopes)
    per_row = (slopes[query_seq] if slopes.ndim == 2 else np.broadcast_to(slopes, (len(query_seq), hq))).T
    distance = np.abs(query_position[:, None] - key_position[None, :])
    return np.where(keep, -per_row[:, :, None] * distance, -np.inf)[None]


def paged_gather(cache, block_table):
    """Every page of each sequence's table, in table order: (B, max_blocks * block_size, Hkv, D) (the unused entries
    of a table name some page: gathered, then masked by seqused_k)."""
    table = host_ints(block_table)
    gathered = cache[table.reshape(-1)] if isinstance(cache, np.ndarray) else cache[table.reshape(-1).tolist()]
    return gathered.reshape((table.shape[0], table.shape[1] * cache.shape[1]) + tuple(cache.shape[2:]))


def paged_mask(seqused_k, lq: int, keys: int, is_causal, window, alibi_slopes, hq: int,
                alignment: str = "bottom-right") -> np.ndarray:
    """sdpa_paged's mask over the gathered keys, (B, 1, Lq, keys) boolean, or with ALiBi (B, Hq, Lq, keys) float64."""
    used = host_ints(seqused_k).reshape(-1, 1, 1, 1)
    query_position = np.arange(lq).reshape(1, 1, lq, 1) + ((used - lq) if alignment == "bottom-right" else 0)
    key_position = np.arange(keys).reshape(1, 1, 1, keys)
    keep = (key_position < used) & sequence_keep(query_position, key_position, is_causal, window)
    if alibi_slopes is None:
        return keep
    slopes = host_floats(alibi_slopes)
    slopes = slopes.reshape((1,) * (2 - slopes.ndim) + slopes.shape + (1, 1))
    return np.where(keep, -slopes * np.abs(query_position - key_position), -np.inf)


def host_floats(x) -> np.ndarray:
    return np.asarray(x.cpu() if hasattr(x, "cpu") else x).astype(np.float64)


def per_row_slopes(alibi_slopes, query_seq: np.ndarray, hq: int) -> np.ndarray:
    """(Hq, rows): each packed query row's ALiBi slopes (its sequence's row of (B, Hq), or the (Hq,) ones); 0
    without."""
    if alibi_slopes is None:
        return np.zeros((hq, len(query_seq)))
    slopes = host_floats(alibi_slopes)
    return np.array((slopes[query_seq] if slopes.ndim == 2 else np.broadcast_to(slopes, (len(query_seq), hq))).T)


def sink_4d(learnable_sink, hq: int):
    """The learnable sink logits (Hq,) as (1, Hq, 1, 1), in their own array type (sdpa.learnable-sink)."""
    if tuple(learnable_sink.shape) != (hq,):
        raise ValueError(f"learnable_sink has shape {tuple(learnable_sink.shape)}; (Hq,) = ({hq},) expected")
    return learnable_sink.reshape(1, hq, 1, 1)


def slopes_4d(slopes, hq: int):
    """ALiBi slopes (Hq,) or (B, Hq) as (1 or B, Hq, 1, 1), in the slopes' own array type."""
    return slopes.reshape((1,) * (2 - slopes.ndim) + tuple(slopes.shape) + (1, 1))


def head_groups(q, k) -> int:
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    return hq // hkv


def split_heads(x, num_heads, xp):
    b, length, width = x.shape
    return xp.swapaxes(x.reshape(b, length, num_heads, width // num_heads), 1, 2)


def merge_heads(x, xp):
    b, h, length, width = x.shape
    return xp.swapaxes(x, 1, 2).reshape(b, length, h * width)


def projected(x, params, name):
    y = x @ params["w_" + name]
    bias = params.get("b_" + name)
    return y if bias is None else y + bias


def mha_with(sdpa, query, key, value, params, num_heads, mask, is_causal, xp, **variants):
    """Multi-head attention over any sdpa; the array namespace xp supplies reshape helpers. ``variants``: the variant
    keywords a case uses (mha.variants), handed to each head's sdpa after the projections."""
    q = split_heads(projected(query, params, "q"), num_heads, xp)
    k = split_heads(projected(key, params, "k"), num_heads, xp)
    v = split_heads(projected(value, params, "v"), num_heads, xp)
    context = sdpa(q, k, v, mask=mask, is_causal=is_causal, **variants)
    return projected(merge_heads(context, xp), params, "o")


def used_variants(**variants) -> dict:
    """The variant keywords of a multi_head_attention call that differ from their defaults (the ones a case uses),
    to hand to its sdpa: an sdpa without one of the others then still runs the case."""
    from attention_conformance.conformance.reference import oracle

    return oracle.variant_options(variants)


def differentiated_eagerly(*arrays) -> bool:
    """Whether every tracer among ``arrays`` is one of an eager jax.vjp / jax.jvp (its primal a concrete array), not
    of a jit: a custom_vjp's rules then get concrete arrays, which can be padded on the host."""
    import jax

    tracers = [a for a in arrays if isinstance(a, jax.core.Tracer)]
    primals = [getattr(a, "primal", None) for a in tracers]  # JVP and linearize tracers have one
    return bool(tracers) and all(p is not None and not isinstance(p, jax.core.Tracer) for p in primals)


# ------------------------------------------------------------------ merging partial states
def merge_states_with(xp, out, lse, learnable_sink=None):
    """merge_states (docs/contract.md) as FlashInfer's MergeStatesKernel computes it, in NumPy or jax.numpy
    (``xp``): in float32 (float64 for float64 parts), the largest lse subtracted before any exponential, a part
    without keys (lse -inf) weighing exactly 0, a sink once; a row without any key gives out 0 and lse -inf."""
    acc = xp.float64 if out.dtype == xp.float64 else xp.float32
    parts_lse = lse.astype(acc)
    top = xp.max(parts_lse, axis=0)
    sink = None
    if learnable_sink is not None:
        sink = xp.asarray(learnable_sink).astype(acc).reshape(1, -1, 1)
        top = xp.maximum(top, sink)
    top = xp.where(xp.isneginf(top), xp.zeros_like(top), top)
    weights = xp.exp(parts_lse - top)
    total = xp.sum(weights, axis=0) + (xp.exp(sink - top) if sink is not None else 0.0)
    values = xp.where(weights[..., None] > 0, out.astype(acc), xp.zeros((), acc))
    merged = xp.sum(weights[..., None] * values, axis=0)
    found = total > 0
    merged = xp.where(found[..., None], merged / xp.where(found, total, 1.0)[..., None], xp.zeros((), acc))
    merged_lse = xp.where(found, top + xp.log(xp.where(found, total, 1.0)), -xp.inf)
    return merged.astype(out.dtype), merged_lse.astype(xp.float64 if acc == xp.float64 else xp.float32)

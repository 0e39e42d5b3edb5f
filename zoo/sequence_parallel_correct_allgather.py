"""Correct (sequence parallel): every rank all-gathers k and v, then attends its own queries to the whole sequence.

Context parallelism as Llama 3 trains it (and ring-flash-attention's llama3 variant): no ring and no merge of
partial states; one all-gather of k and v (shards padded to the longest, the padding at position -1 removed), then
one softmax per query row over every key, the learnable sink as one more column of the scores with no value.
Written apart from the built-in ring and Ulysses: an all-gather whose backward is one all-reduce, torch's own
logsumexp.
"""
import numpy as np

BUG = "none"
SOURCE = ("Llama 3 context parallelism (all-gather of k, v; Dubey et al. 2024, 3.3.2); ring-flash-attention "
          "llama3_flash_attn_varlen.py; zoo extra (2026-11-28)")
EXPECTED_CLAUSES = frozenset()
ARRAY = "torch"
DTYPES = ("float64", "float32")
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = {"layouts": ["contiguous", "zigzag"], "world_sizes": {"min": 2, "max": 8},
                     "uneven_lengths": True, "heads": "any", "gradients": True,
                     "lse_gradients": True}


def _positions(length, size, layout, rank):
    if layout == "contiguous":
        return np.array_split(np.arange(length), size)[rank]
    chunks = np.array_split(np.arange(length), 2 * size)
    return np.concatenate([chunks[rank], chunks[2 * size - 1 - rank]])


def all_gather(x, group):
    """x of every rank, concatenated along the sequence (dim 2); differentiable: each rank's gradient is the sum over
    the ranks of the gradient of its block (one all-reduce)."""
    import torch
    import torch.distributed as dist

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, tensor):
            parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
            dist.all_gather(parts, tensor.contiguous(), group=group)
            return torch.cat(parts, dim=2)

        @staticmethod
        def backward(ctx, grad):
            total = grad.contiguous().clone()
            dist.all_reduce(total, group=group)
            return total.chunk(dist.get_world_size(group), dim=2)[dist.get_rank(group)]

    return Gather.apply(x)


def sdpa_sequence_parallel(q, k, v, *, group=None, sequence_layout="contiguous", is_causal=False, scale=None,
                           window=None, learnable_sink=None, return_lse=False):
    import torch
    import torch.distributed as dist

    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    dist.all_gather(lengths, torch.tensor([q.shape[2]]), group=group)
    lengths = [int(n) for n in lengths]
    longest = max(lengths)
    # k and v in one all-gather: two would be two collectives in the backward, which autograd may run in another
    # order on each rank (their branches are independent), summing one rank's dk with another's dv.
    both = torch.nn.functional.pad(torch.cat([k, v], dim=-1), (0, 0, 0, longest - k.shape[2]))
    keys, values = all_gather(both, group).split([k.shape[-1], v.shape[-1]], dim=-1)
    return attend(q, keys, values, lengths, group, sequence_layout, is_causal, scale, window, learnable_sink,
                  return_lse)


def attend(q, keys, values, lengths, group, sequence_layout, is_causal, scale, window, learnable_sink, return_lse):
    """This rank's queries against every rank's keys (padded to the longest shard, the padding at position -1)."""
    import torch
    import torch.distributed as dist

    rank, size = dist.get_rank(group), dist.get_world_size(group)
    total, longest = sum(lengths), max(lengths)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    key_pos = torch.cat([torch.cat([torch.from_numpy(_positions(total, size, sequence_layout, r)),
                                    torch.full((longest - lengths[r],), -1, dtype=torch.int64)])
                         for r in range(size)])
    query_pos = torch.from_numpy(_positions(total, size, sequence_layout, rank))
    group_size = q.shape[1] // keys.shape[1]
    keys = keys.to(work).repeat_interleave(group_size, 1)
    values = values.to(work).repeat_interleave(group_size, 1)
    scores = (q.to(work) @ keys.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    keep = (key_pos[None, :] >= 0) & torch.ones(len(query_pos), 1, dtype=torch.bool)
    if is_causal:
        keep &= key_pos[None, :] <= query_pos[:, None]
    if window is not None:
        left, right = window
        if left is not None:
            keep &= key_pos[None, :] >= query_pos[:, None] - left
        if right is not None:
            keep &= key_pos[None, :] <= query_pos[:, None] + right
    scores = scores.masked_fill(~keep, float("-inf"))
    if learnable_sink is not None:
        sink = learnable_sink.to(work)[None, :, None, None].expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    if learnable_sink is not None:
        weights = weights[..., :-1]
    out = (weights @ values).to(q.dtype)
    return (out, lse.to(torch.float32)) if return_lse else out

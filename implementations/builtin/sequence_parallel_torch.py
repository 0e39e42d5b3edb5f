"""Sequence-parallel attention on torch.distributed (gloo on the CPU): ring attention (torch_ring) and Ulysses
(torch_ulysses), each ``sdpa_sequence_parallel(q, k, v, *, group, ...)`` called on every rank of ``group`` with
that rank's shards (implementations/sequence_parallel.py: the layouts).

- Ring: k and v go round the group (``batch_isend_irecv``: send to rank r + 1, receive from r - 1), so that at step
  s rank r holds the block of rank r - s. Each block's partial state (out, lse) is merged into the running one by
  its log-sum-exp; a block whose every (query, key) pair the causal band or the window removes is skipped. The
  learnable sink is the running state's start (out 0, lse = sigma_h): counted once. Its backward is a
  torch.autograd.Function that sends dk and dv round the ring with k and v and, after the last step, one hop
  further home (ring-flash-attention's schedule); dq stays on its rank; dsink is the rank's share (the suite sums
  the shares, as data parallelism sums a replicated parameter's gradient).
- Ulysses (DeepSpeed's DistributedAttention): an all-to-all turns sequence shards of every head into the whole
  sequence of Hq / N heads, one attention runs locally, a second all-to-all turns it back. Hq must be a multiple
  of N (declared); kv heads that are not are repeated to Hq first.

Shards may be uneven (``np.array_split``'s lengths): the ring pads every k, v block to the longest shard with keys
at position -1, which no query attends; Ulysses' all-to-all takes the lengths as its split sizes. Computation is in
float32 (float64 for float64 inputs); the output has q's dtype and lse is float32, the contract's.

The ring's steps are methods (``merge``, ``peers``, ``block_source``, ``positions``, ``computes``, ``after_step``,
``block_length``, ``send_home``), so that a zoo member changes one of them (zoo/sequence_parallel_*).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attention_conformance.implementations.sequence_parallel import rank_order, shard_positions

TORCH_SEQUENCE_PARALLEL = {"layouts": ["contiguous", "zigzag"], "world_sizes": {"min": 2, "max": 8},
                           "uneven_lengths": True, "gradients": True,
                           "lse_gradients": True}


def accumulator(dtype):
    import torch

    return torch.float64 if dtype == torch.float64 else torch.float32


def block_mask(q_pos, k_pos, is_causal: bool, window):
    """(Lq, Lk) bool: the keys each query attends, by global position; position -1 is padding."""
    qp, kp = q_pos[:, None], k_pos[None, :]
    keep = (qp >= 0) & (kp >= 0)
    if is_causal:
        keep = keep & (kp <= qp)
    if window is not None:
        left, right = window
        if left is not None:
            keep = keep & (kp >= qp - left)
        if right is not None:
            keep = keep & (kp <= qp + right)
    return keep


def _grouped(q, kv_heads: int):
    batch, heads, length, dim = q.shape
    return q.reshape(batch, kv_heads, heads // kv_heads, length, dim)


def block_attention(q, k, v, mask, scale):
    """(out, lse) of q against one block of keys, in the accumulator's dtype; a row without keys gives (0, -inf),
    with no NaN in the values or their gradients. q (B, Hq, Lq, Dk), k and v (B, Hkv, Lk, D): query head h reads kv
    head h // (Hq / Hkv)."""
    import torch

    acc = accumulator(q.dtype)
    batch, heads, length, _ = q.shape
    s = torch.einsum("bhgqd,bhkd->bhgqk", _grouped(q.to(acc), k.shape[1]), k.to(acc)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    top = s.amax(-1, keepdim=True).detach()
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    p = torch.exp(s - top)
    total = p.sum(-1, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    out = torch.einsum("bhgqk,bhkd->bhgqd", p, v.to(acc)) / safe
    lse = torch.where(total > 0, top + torch.log(safe), torch.full_like(total, float("-inf")))[..., 0]
    return out.reshape(batch, heads, length, -1), lse.reshape(batch, heads, length)


def block_backward(q, k, v, mask, scale, d_out, delta, lse):
    """(dq, dk, dv) of one block given the row's global lse and delta = rowsum(dO * O) - dlse (FlashAttention's
    backward: the weights recomputed as exp(s - lse))."""
    import torch

    acc = accumulator(q.dtype)
    batch, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    qg = _grouped(q.to(acc), kv_heads)
    dog = _grouped(d_out.to(acc), kv_heads)
    s = torch.einsum("bhgqd,bhkd->bhgqk", qg, k.to(acc)) * scale
    row_lse = _grouped(lse[..., None], kv_heads)
    row_lse = torch.where(torch.isfinite(row_lse), row_lse, torch.zeros_like(row_lse))
    p = torch.where(mask, torch.exp(s - row_lse), torch.zeros_like(s))
    dv = torch.einsum("bhgqk,bhgqd->bhkd", p, dog)
    dp = torch.einsum("bhgqd,bhkd->bhgqk", dog, v.to(acc))
    ds = p * (dp - _grouped(delta[..., None], kv_heads))
    dq = torch.einsum("bhgqk,bhkd->bhgqd", ds, k.to(acc)).reshape(batch, heads, length, dim) * scale
    dk = torch.einsum("bhgqk,bhgqd->bhkd", ds, qg) * scale
    return dq, dk, dv


def merge(out_a, lse_a, out_b, lse_b):
    """The state over the union of two disjoint key sets: out = sum_p exp(lse_p - lse) out_p, lse = log sum_p
    exp(lse_p), around the larger lse; an empty part (lse -inf) adds nothing and no NaN."""
    import torch

    top = torch.maximum(lse_a, lse_b)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weight_a, weight_b = torch.exp(lse_a - top), torch.exp(lse_b - top)
    total = weight_a + weight_b
    safe = torch.where(total > 0, total, torch.ones_like(total))
    out = (weight_a[..., None] * out_a + weight_b[..., None] * out_b) / safe[..., None]
    lse = torch.where(total > 0, top + torch.log(safe), torch.full_like(total, float("-inf")))
    return out, lse


def sink_state(sink, shape, value_dim: int, acc):
    """The learnable sink as a partial state: no value (out 0) and lse sigma_h."""
    import torch

    batch, heads, length = shape
    return (torch.zeros(batch, heads, length, value_dim, dtype=acc),
            sink.to(acc)[None, :, None].expand(batch, heads, length))


def group_rank_size(group) -> tuple[int, int]:
    import torch.distributed as dist

    return dist.get_rank(group), dist.get_world_size(group)


def shard_lengths(local: int, group) -> tuple[int, ...]:
    """Every rank's shard length (one all_gather)."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    found = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(found, torch.tensor([local], dtype=torch.int64), group=group)
    return tuple(int(n) for n in found)


def check_heads(q, k) -> None:
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"Hq = {q.shape[1]} is not a multiple of Hkv = {k.shape[1]}")


@dataclass(frozen=True)
class RingSetup:
    """One call's ring: the group, this rank, every rank's shard length, the options."""

    group: Any
    rank: int
    size: int
    lengths: tuple[int, ...]
    layout: str
    is_causal: bool
    scale: float
    window: tuple | None

    @property
    def length(self) -> int:
        return sum(self.lengths)


class _RingFunction:
    """torch.autograd.Function of the ring (made on first use: torch is imported only then)."""

    _made = None

    @classmethod
    def apply(cls, *args):
        if cls._made is None:
            import torch

            class RingAttention(torch.autograd.Function):
                @staticmethod
                def forward(ctx, q, k, v, sink, engine, setup):
                    out, lse = engine.ring_forward(q, k, v, sink, setup)
                    ctx.save_for_backward(q, k, v, out, lse, *([] if sink is None else [sink]))
                    ctx.engine, ctx.setup, ctx.has_sink = engine, setup, sink is not None
                    return out.to(q.dtype), lse.to(torch.float32)

                @staticmethod
                def backward(ctx, d_out, d_lse):
                    q, k, v, out, lse, *rest = ctx.saved_tensors
                    sink = rest[0] if ctx.has_sink else None
                    dq, dk, dv, dsink = ctx.engine.ring_backward(q, k, v, sink, out, lse, d_out, d_lse, ctx.setup)
                    return dq, dk, dv, dsink, None, None

            cls._made = RingAttention
        return cls._made.apply(*args)


class TorchRingAttention:
    """Ring attention on torch.distributed, with its own backward (module docstring)."""

    NAME = "torch_ring"
    ARRAY = "torch"
    DTYPES = ("float64", "float32")
    DEVICES = ("cpu",)
    SEQUENCE_PARALLEL = TORCH_SEQUENCE_PARALLEL

    def sdpa_sequence_parallel(self, q, k, v, *, group=None, sequence_layout="contiguous", is_causal=False,
                               scale=None, window=None, learnable_sink=None, return_lse=False):
        check_heads(q, k)
        rank, size = group_rank_size(group)
        setup = RingSetup(group, rank, size, shard_lengths(q.shape[2], group), sequence_layout, bool(is_causal),
                          q.shape[-1] ** -0.5 if scale is None else float(scale),
                          None if window is None else tuple(window))
        out, lse = _RingFunction.apply(q, k, v, learnable_sink, self, setup)
        return (out, lse) if return_lse else out

    # ------------------------------------------------------------ the ring's steps
    def positions(self, setup: RingSetup, rank: int):
        """The global positions rank ``rank``'s shard holds."""
        import torch

        return torch.from_numpy(shard_positions(setup.length, setup.size, setup.layout, rank))

    def block_length(self, setup: RingSetup) -> int:
        """Every k, v block is padded to this length before it travels (the longest shard's)."""
        return max(setup.lengths)

    def key_positions(self, setup: RingSetup, rank: int, padded: int):
        """The positions of rank ``rank``'s block as it travels: its own, then -1 (padding) up to ``padded``."""
        import torch

        own = self.positions(setup, rank)[:padded]
        return torch.cat([own, torch.full((padded - own.numel(),), -1, dtype=own.dtype)])

    def peers(self, setup: RingSetup) -> tuple[int, int]:
        """(the rank this one sends to, the rank it receives from), as group ranks."""
        return (setup.rank + 1) % setup.size, (setup.rank - 1) % setup.size

    def block_source(self, setup: RingSetup, step: int) -> int:
        """Whose block this rank holds at ``step``."""
        return (setup.rank - step) % setup.size

    def computes(self, mask, source: int, setup: RingSetup) -> bool:
        """Whether the block is computed: not when no (query, key) pair of it is attended."""
        return bool(mask.any())

    def merge(self, out_a, lse_a, out_b, lse_b):
        return merge(out_a, lse_a, out_b, lse_b)

    def initial_state(self, q, v, sink, acc):
        import torch

        batch, heads, length, _ = q.shape
        if sink is not None:
            return sink_state(sink, (batch, heads, length), v.shape[-1], acc)
        return (torch.zeros(batch, heads, length, v.shape[-1], dtype=acc),
                torch.full((batch, heads, length), float("-inf"), dtype=acc))

    def after_step(self, out, lse, step: int, sink, acc):
        """The running state after ``step``'s block (nothing to add: the sink was the start)."""
        return out, lse

    def rotate(self, tensors, setup: RingSetup):
        """Send each tensor to the next rank and receive the previous rank's (one batch of P2P operations)."""
        import torch
        import torch.distributed as dist

        send_to, receive_from = self.peers(setup)
        received = [torch.empty_like(t) for t in tensors]
        operations = []
        for tensor, buffer in zip(tensors, received):
            operations.append(dist.P2POp(dist.isend, tensor.contiguous(), self._global(setup, send_to), setup.group))
            operations.append(dist.P2POp(dist.irecv, buffer, self._global(setup, receive_from), setup.group))
        for request in dist.batch_isend_irecv(operations):
            request.wait()
        return received

    def send_home(self, gradients, setup: RingSetup):
        """After the last step each rank holds the dk, dv of the next rank's block: one more hop takes them home."""
        return self.rotate(gradients, setup)

    @staticmethod
    def _global(setup: RingSetup, group_rank: int) -> int:
        import torch.distributed as dist

        return group_rank if setup.group is None else dist.get_global_rank(setup.group, group_rank)

    # ------------------------------------------------------------ forward and backward
    def ring_forward(self, q, k, v, sink, setup: RingSetup):
        acc = accumulator(q.dtype)
        padded = self.block_length(setup)
        q_pos = self.positions(setup, setup.rank)
        blocks = [_pad(k, padded), _pad(v, padded)]
        out, lse = self.initial_state(q, v, sink, acc)
        for step in range(setup.size):
            source = self.block_source(setup, step)
            mask = block_mask(q_pos, self.key_positions(setup, source, padded), setup.is_causal, setup.window)
            if self.computes(mask, source, setup):
                out, lse = self.merge(out, lse, *block_attention(q, *blocks, mask, setup.scale))
            out, lse = self.after_step(out, lse, step, sink, acc)
            if step < setup.size - 1:
                blocks = self.rotate(blocks, setup)
        return out, lse

    def ring_backward(self, q, k, v, sink, out, lse, d_out, d_lse, setup: RingSetup):
        import torch

        acc = accumulator(q.dtype)
        delta = (d_out.to(acc) * out).sum(-1)
        if d_lse is not None:
            delta = delta - d_lse.to(acc)
        padded = self.block_length(setup)
        q_pos = self.positions(setup, setup.rank)
        k_block, v_block = _pad(k, padded), _pad(v, padded)
        dq = torch.zeros(q.shape, dtype=acc)
        dk_block = torch.zeros(k_block.shape, dtype=acc)
        dv_block = torch.zeros(v_block.shape, dtype=acc)
        for step in range(setup.size):
            source = self.block_source(setup, step)
            mask = block_mask(q_pos, self.key_positions(setup, source, padded), setup.is_causal, setup.window)
            if self.computes(mask, source, setup):
                gq, gk, gv = block_backward(q, k_block, v_block, mask, setup.scale, d_out, delta, lse)
                dq, dk_block, dv_block = dq + gq, dk_block + gk, dv_block + gv
            if step < setup.size - 1:
                k_block, v_block, dk_block, dv_block = self.rotate([k_block, v_block, dk_block, dv_block], setup)
        dk_block, dv_block = self.send_home([dk_block, dv_block], setup)
        dsink = None
        if sink is not None:
            finite = torch.isfinite(lse)
            share = torch.where(finite, torch.exp(sink.to(acc)[None, :, None] - torch.where(finite, lse, 0 * lse)),
                                torch.zeros_like(lse))
            dsink = (-(share * delta).sum((0, 2))).to(sink.dtype)
        return (dq.to(q.dtype), dk_block[:, :, :k.shape[2]].to(k.dtype), dv_block[:, :, :v.shape[2]].to(v.dtype),
                dsink)


def _pad(x, length: int):
    import torch

    if x.shape[2] >= length:
        return x[:, :, :length]
    return torch.nn.functional.pad(x, (0, 0, 0, length - x.shape[2]))


# ------------------------------------------------------------------ Ulysses
class _AllToAll:
    """all_to_all_single along dim 0 with split sizes, differentiable (its backward is the reverse exchange)."""

    _made = None

    @classmethod
    def apply(cls, *args):
        if cls._made is None:
            import torch
            import torch.distributed as dist

            class AllToAll(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x, in_splits, out_splits, group):
                    ctx.splits = (in_splits, out_splits, group)
                    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
                    dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
                    return out

                @staticmethod
                def backward(ctx, grad):
                    in_splits, out_splits, group = ctx.splits
                    return AllToAll.apply(grad, out_splits, in_splits, group), None, None, None

            cls._made = AllToAll
        return cls._made.apply(*args)


def sequence_to_heads(x, lengths, group):
    """(B, H, Ls, D) of this rank's positions -> (B, H / N, L, D) of every position (in rank order)."""
    size = len(lengths)
    batch, heads, local, dim = x.shape
    rows = x.reshape(batch, size, heads // size, local, dim).permute(1, 3, 0, 2, 4).reshape(size * local, batch,
                                                                                          heads // size, dim)
    return _AllToAll.apply(rows, [local] * size, list(lengths), group).permute(1, 2, 0, 3)


def heads_to_sequence(y, lengths, rank: int, group):
    """The inverse of sequence_to_heads: (B, H / N, L, D) -> (B, H, Ls, D) of this rank's positions."""
    size = len(lengths)
    batch, heads, _, dim = y.shape
    local = lengths[rank]
    rows = _AllToAll.apply(y.permute(2, 0, 1, 3), list(lengths), [local] * size, group)
    return rows.reshape(size, local, batch, heads, dim).permute(2, 0, 3, 1, 4).reshape(batch, size * heads, local,
                                                                                       dim)


class TorchUlyssesAttention:
    """Ulysses sequence parallelism on torch.distributed: all-to-all to head shards and back (module docstring)."""

    NAME = "torch_ulysses"
    ARRAY = "torch"
    DTYPES = ("float64", "float32")
    DEVICES = ("cpu",)
    SEQUENCE_PARALLEL = {**TORCH_SEQUENCE_PARALLEL, "heads": "divisible"}

    def sdpa_sequence_parallel(self, q, k, v, *, group=None, sequence_layout="contiguous", is_causal=False,
                               scale=None, window=None, learnable_sink=None, return_lse=False):
        import torch

        check_heads(q, k)
        rank, size = group_rank_size(group)
        heads, kv_heads = q.shape[1], k.shape[1]
        if heads % size:
            raise ValueError(f"Ulysses needs the query heads ({heads}) divisible by the group's size ({size})")
        if kv_heads % size:  # too few kv heads to split: each repeated to its query heads (exact, costs memory)
            k, v = k.repeat_interleave(heads // kv_heads, dim=1), v.repeat_interleave(heads // kv_heads, dim=1)
        lengths = shard_lengths(q.shape[2], group)
        total = sum(lengths)
        everywhere = torch.from_numpy(rank_order(total, size, sequence_layout))  # the order the all-to-all gathers
        q_heads, k_heads, v_heads = (sequence_to_heads(t, lengths, group) for t in (q, k, v))
        out, lse = block_attention(q_heads, k_heads, v_heads, block_mask(everywhere, everywhere, is_causal, window),
                                   q.shape[-1] ** -0.5 if scale is None else scale)
        if learnable_sink is not None:
            own = heads // size
            out, lse = merge(out, lse, *sink_state(learnable_sink[rank * own:(rank + 1) * own], lse.shape,
                                                   out.shape[-1], out.dtype))
        out = heads_to_sequence(out, lengths, rank, group).to(q.dtype)
        lse = heads_to_sequence(lse[..., None], lengths, rank, group)[..., 0].to(torch.float32)
        return (out, lse) if return_lse else out

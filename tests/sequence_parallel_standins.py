"""Sequence-parallel stand-ins that misbehave as processes do, for tests/test_sequence_parallel.py: a rank that
never sends (its peer waits forever), a rank that raises while its peers wait for it, and a JAX collective that only
device 0 enters (XLA:CPU then waits, and after about 60 s aborts the whole process)."""
from __future__ import annotations


class HangingRing:
    """Each rank sends its k to the next and receives from the previous, except rank 1, which never sends: the rank
    after it waits forever."""

    NAME = "hanging_ring"
    ARRAY = "torch"
    DTYPES = ("float32",)
    DEVICES = ("cpu",)

    def sdpa_sequence_parallel(self, q, k, v, *, group=None, sequence_layout="contiguous", is_causal=False,
                               scale=None, window=None, learnable_sink=None, return_lse=False):
        import torch
        import torch.distributed as dist

        rank, size = dist.get_rank(group), dist.get_world_size(group)
        received = torch.empty_like(k)
        request = None
        if rank != 1:
            request = dist.isend(k.detach().contiguous(), dst=dist.get_global_rank(group, (rank + 1) % size),
                                 group=group)
        dist.recv(received, src=dist.get_global_rank(group, (rank - 1) % size), group=group)
        if request is not None:
            request.wait()
        return torch.zeros(q.shape[:3] + v.shape[-1:], dtype=q.dtype)


class RaisingRank:
    """Rank 0 raises before the barrier its peers wait in."""

    NAME = "raising_rank"
    ARRAY = "torch"
    DTYPES = ("float32",)
    DEVICES = ("cpu",)

    def sdpa_sequence_parallel(self, q, k, v, *, group=None, sequence_layout="contiguous", is_causal=False,
                               scale=None, window=None, learnable_sink=None, return_lse=False):
        import torch.distributed as dist

        if dist.get_rank(group) == 0:
            raise RuntimeError("rank 0 gives up before the barrier")
        dist.barrier(group=group)
        return q


class HangingCollective:
    """Only device 0 enters a psum; the others never join it."""

    NAME = "hanging_collective"
    ARRAY = "jax"
    DTYPES = ("float32",)
    DEVICES = ("cpu",)

    def sdpa_sequence_parallel(self, q, k, v, *, axis_name, sequence_layout="contiguous", is_causal=False,
                               scale=None, window=None, learnable_sink=None, return_lse=False):
        import jax

        rank = jax.lax.axis_index(axis_name)

        def summed(x):
            return jax.lax.pcast(jax.lax.psum(x, axis_name), (axis_name,), to="varying")

        return jax.lax.cond(rank == 0, summed, lambda x: x, q)


class RefusingCausal:
    """Every rank raises NotImplementedError for is_causal: such cases are unsupported, not failed."""

    NAME = "refusing_causal"
    ARRAY = "torch"
    DTYPES = ("float32",)
    DEVICES = ("cpu",)

    def sdpa_sequence_parallel(self, q, k, v, *, group=None, sequence_layout="contiguous", is_causal=False,
                               scale=None, window=None, learnable_sink=None, return_lse=False):
        if is_causal:
            raise NotImplementedError("no causal ring yet")
        return q

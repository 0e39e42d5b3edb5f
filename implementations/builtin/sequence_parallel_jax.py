"""Sequence-parallel attention in JAX: ring attention (jax_ring) and Ulysses (jax_ulysses), each
``sdpa_sequence_parallel(q, k, v, *, axis_name, ...)`` called inside ``shard_map`` over a 1-D mesh axis named
``axis_name``, every device holding its shards (implementations/sequence_parallel.py: the layouts).

- Ring: k and v go round the axis with ``lax.ppermute`` (device r sends to r + 1), so that at step s device r holds
  the block of device r - s; each block's (out, lse) is merged into the running state by its log-sum-exp, a block
  that the causal band or the window removes entirely is skipped (``lax.cond``, a real branch per device). The
  learnable sink is the running state's start (out 0, lse = sigma_h): counted once. Differentiated by JAX itself
  through ppermute and cond; the sink's gradient is summed over the devices by shard_map's transpose.
- Ulysses: ``lax.all_to_all`` from sequence shards of every head to the whole sequence of Hq / N heads, one
  attention, and back. Hq must be a multiple of N (declared); kv heads that are not are repeated to Hq first.

Every shard has the same length (shard_map splits the axis into equal blocks): L a multiple of N, of 2N for zigzag.
Computation is in float32 (float64 for float64 inputs); the output has q's dtype, lse is float32.

The ring's steps are methods (``positions``, ``permutation``, ``merge``), so that a zoo member changes one.
"""
from __future__ import annotations

JAX_SEQUENCE_PARALLEL = {"layouts": ["contiguous", "zigzag"], "world_sizes": {"min": 2, "max": 8},
                         "uneven_lengths": False, "gradients": True,
                         "lse_gradients": True}


def accumulator(dtype):
    import jax.numpy as jnp

    return jnp.promote_types(dtype, jnp.float32)


def block_mask(q_pos, k_pos, is_causal: bool, window):
    import jax.numpy as jnp

    qp, kp = q_pos[:, None], k_pos[None, :]
    keep = jnp.ones((q_pos.shape[0], k_pos.shape[0]), bool)
    if is_causal:
        keep &= kp <= qp
    if window is not None:
        left, right = window
        if left is not None:
            keep &= kp >= qp - left
        if right is not None:
            keep &= kp <= qp + right
    return keep


def block_attention(q, k, v, mask, scale):
    """(out, lse) of q against one block, in the accumulator's dtype; a row without keys gives (0, -inf), with no
    NaN in the values or their gradients (the maximum is a constant to autodiff; log and divide are guarded)."""
    import jax
    import jax.numpy as jnp

    batch, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    acc = accumulator(q.dtype)
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, length, dim)
    s = jnp.einsum("bhgqd,bhkd->bhgqk", grouped, k, preferred_element_type=acc) * scale
    s = jnp.where(mask, s, -jnp.inf)
    top = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    p = jnp.exp(s - top)
    total = p.sum(-1, keepdims=True)
    safe = jnp.where(total > 0, total, 1.0)
    out = jnp.einsum("bhgqk,bhkd->bhgqd", p, v.astype(acc), preferred_element_type=acc) / safe
    lse = jnp.where(total > 0, top + jnp.log(safe), -jnp.inf)[..., 0]
    return out.reshape(batch, heads, length, -1), lse.reshape(batch, heads, length)


def merge(out_a, lse_a, out_b, lse_b):
    """The state over the union of two disjoint key sets (the log-sum-exp merge); an empty part adds nothing."""
    import jax
    import jax.numpy as jnp

    top = jax.lax.stop_gradient(jnp.maximum(lse_a, lse_b))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    weight_a, weight_b = jnp.exp(lse_a - top), jnp.exp(lse_b - top)
    total = weight_a + weight_b
    safe = jnp.where(total > 0, total, 1.0)
    out = (weight_a[..., None] * out_a + weight_b[..., None] * out_b) / safe[..., None]
    return out, jnp.where(total > 0, top + jnp.log(safe), -jnp.inf)


def empty_state(q, v, acc):
    import jax.numpy as jnp

    batch, heads, length, _ = q.shape
    return jnp.zeros((batch, heads, length, v.shape[-1]), acc), jnp.full((batch, heads, length), -jnp.inf, acc)


def sink_state(sink, q, v, acc):
    """The learnable sink as a partial state: no value (out 0) and lse sigma_h."""
    import jax.numpy as jnp

    out, _ = empty_state(q, v, acc)
    return out, jnp.broadcast_to(sink.astype(acc)[None, :, None], out.shape[:3])


def check_heads(q, k) -> None:
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"Hq = {q.shape[1]} is not a multiple of Hkv = {k.shape[1]}")


class JaxRingAttention:
    """Ring attention under shard_map (module docstring)."""

    NAME = "jax_ring"
    ARRAY = "jax"
    DTYPES = ("float32",)  # float64 runs too; each dtype is another XLA compile of every program
    DEVICES = ("cpu",)
    SEQUENCE_PARALLEL = JAX_SEQUENCE_PARALLEL

    def sdpa_sequence_parallel(self, q, k, v, *, axis_name, sequence_layout="contiguous", is_causal=False,
                               scale=None, window=None, learnable_sink=None, return_lse=False):
        import jax
        import jax.numpy as jnp

        check_heads(q, k)
        size = jax.lax.axis_size(axis_name)
        rank = jax.lax.axis_index(axis_name)
        local = q.shape[2]
        if sequence_layout == "zigzag" and local % 2:
            raise ValueError("zigzag needs an even shard length (L a multiple of 2N)")
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        window = None if window is None else tuple(window)
        acc = accumulator(q.dtype)
        q_pos = self.positions(rank, size, local, sequence_layout)
        out, lse = empty_state(q, v, acc) if learnable_sink is None else sink_state(learnable_sink, q, v, acc)
        k_block, v_block = k, v
        for step in range(size):
            k_pos = self.positions((rank - step) % size, size, local, sequence_layout)
            mask = block_mask(q_pos, k_pos, is_causal, window)

            def skipped(q_, k_, v_, m_):  # shard_map's check_vma: both branches vary along the axis
                return tuple(jax.lax.pcast(x, (axis_name,), to="varying") for x in empty_state(q_, v_, acc))

            block = jax.lax.cond(jnp.any(mask), lambda q_, k_, v_, m_: block_attention(q_, k_, v_, m_, scale),
                                 skipped, q, k_block, v_block, mask)
            out, lse = self.merge(out, lse, *block)
            if step < size - 1:
                k_block = jax.lax.ppermute(k_block, axis_name, self.permutation(size))
                v_block = jax.lax.ppermute(v_block, axis_name, self.permutation(size))
        out = out.astype(q.dtype)
        return (out, lse.astype(jnp.float32)) if return_lse else out

    # ------------------------------------------------------------ the ring's steps
    def positions(self, rank, size: int, local: int, layout: str):
        """The global positions of device ``rank``'s shard (``rank`` may be traced)."""
        import jax.numpy as jnp

        if layout == "contiguous":
            return rank * local + jnp.arange(local)
        chunk = local // 2
        return jnp.concatenate([rank * chunk + jnp.arange(chunk), (2 * size - 1 - rank) * chunk + jnp.arange(chunk)])

    def permutation(self, size: int) -> list[tuple[int, int]]:
        """ppermute's (source, destination) pairs: every device sends its block to the next."""
        return [(i, (i + 1) % size) for i in range(size)]

    def merge(self, out_a, lse_a, out_b, lse_b):
        return merge(out_a, lse_a, out_b, lse_b)


class JaxUlyssesAttention:
    """Ulysses under shard_map: all-to-all to head shards and back (module docstring)."""

    NAME = "jax_ulysses"
    ARRAY = "jax"
    DTYPES = ("float32",)
    DEVICES = ("cpu",)
    SEQUENCE_PARALLEL = {**JAX_SEQUENCE_PARALLEL, "heads": "divisible"}

    def sdpa_sequence_parallel(self, q, k, v, *, axis_name, sequence_layout="contiguous", is_causal=False,
                               scale=None, window=None, learnable_sink=None, return_lse=False):
        import functools

        import jax
        import jax.numpy as jnp

        check_heads(q, k)
        size = jax.lax.axis_size(axis_name)
        rank = jax.lax.axis_index(axis_name)
        heads, kv_heads, local = q.shape[1], k.shape[1], q.shape[2]
        if heads % size:
            raise ValueError(f"Ulysses needs the query heads ({heads}) divisible by the axis size ({size})")
        if kv_heads % size:  # too few kv heads to split: each repeated to its query heads (exact, costs memory)
            k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
        to_heads = functools.partial(jax.lax.all_to_all, axis_name=axis_name, split_axis=1, concat_axis=2, tiled=True)
        to_sequence = functools.partial(jax.lax.all_to_all, axis_name=axis_name, split_axis=2, concat_axis=1,
                                        tiled=True)
        ring = JaxRingAttention()
        everywhere = jnp.concatenate([ring.positions(r, size, local, sequence_layout) for r in range(size)])
        acc = accumulator(q.dtype)
        out, lse = block_attention(to_heads(q), to_heads(k), to_heads(v),
                                   block_mask(everywhere, everywhere, is_causal, None if window is None else
                                              tuple(window)), q.shape[-1] ** -0.5 if scale is None else scale)
        if learnable_sink is not None:
            own = heads // size
            sink = jax.lax.dynamic_slice_in_dim(learnable_sink, rank * own, own)
            out, lse = merge(out, lse, *sink_state(sink, out, out, acc))
        out = to_sequence(out).astype(q.dtype)
        lse = to_sequence(lse[..., None])[..., 0].astype(jnp.float32)
        return (out, lse) if return_lse else out

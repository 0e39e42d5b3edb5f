"""The PyPI package ``ringattention`` (haoliuhl's Ring Attention, 0.1.2) under shard_map on JAX host devices:
``ringattention.ringattention_jax.ring_attention`` called on each device's shard, as its README calls it.

Run as its users would: ``pip install ringattention``, then
``python -m pytest conformance --impl examples.ringattention_adapter -n 0`` (``:ChunkOne`` for one-position chunks).
What it takes: (B, L, H, D) shards (transposed here: LAYOUT is sdpa's alone), the contiguous layout (positions
from ``lax.axis_index``), scale 1/sqrt(D), no GQA (kv heads repeated here), no window, sink or lse. Its import calls
``jax.lib.xla_bridge``, gone in jax 0.10: a one-line shim first. It mixes dtypes under x64 (float32 only), and
needs shard_map's check_vma off. Measured: docs/real-libraries.md, "Sequence-parallel libraries".
"""
import types

import jax

if not hasattr(jax.lib, "xla_bridge"):  # ringattention/__init__.py: jax.lib.xla_bridge.get_backend().platform
    backend = types.SimpleNamespace(platform=jax.default_backend())
    jax.lib.xla_bridge = types.SimpleNamespace(get_backend=lambda: backend)
import jax.numpy as jnp  # noqa: E402
from ringattention.ringattention_jax import ring_attention  # noqa: E402

ARRAY = "jax"
DTYPES = ("float32",)
DEVICES = ("cpu",)
SEQUENCE_PARALLEL = {"layouts": ["contiguous"], "check_vma": False}


class RingAttention:
    CHUNK = None  # blockwise chunks of the shard's length (None: the whole shard)
    ARRAY, DTYPES, DEVICES, SEQUENCE_PARALLEL = ARRAY, DTYPES, DEVICES, SEQUENCE_PARALLEL

    def sdpa_sequence_parallel(self, q, k, v, *, axis_name, is_causal=False):
        group = q.shape[1] // k.shape[1]
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, jnp.repeat(k, group, 1), jnp.repeat(v, group, 1)))
        chunk = self.CHUNK or q.shape[1]
        options = dict(causal_block_size=1 if is_causal else None, query_chunk_size=chunk, key_chunk_size=chunk,
                       deterministic=True, dropout_rng=None, attn_pdrop=0.0, dtype=jnp.float32, policy=None,
                       precision=None, prevent_cse=True)
        return jnp.swapaxes(ring_attention(q, k, v, None, None, None, axis_name, True, options), 1, 2)


class ChunkOne(RingAttention):
    NAME = "ringattention_chunk_one"
    CHUNK = 1  # one position per blockwise chunk: the causal diagonal chunk is skipped (below_or_on_diag's >)


sdpa_sequence_parallel = RingAttention().sdpa_sequence_parallel

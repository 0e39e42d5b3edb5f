"""Built-in implementations: one small class per framework code path.

Each class meets the contract in ``implementations/__init__.py``: it exposes
``softmax``, ``sdpa`` and ``multi_head_attention`` on its framework's arrays and
declares ARRAY, DTYPES and FULLY_MASKED_ROWS. Frameworks are imported inside the
methods, never at module import, so listing the built-ins imports no framework.

Paths:
  numpy_oracle  the float64 oracle of conformance/oracle.py (float64 only)
  numpy_native  the same math computed in the input dtype, rounding after every step
  torch_math    hand-written torch ops
  torch_sdpa    torch.nn.functional.scaled_dot_product_attention (torch picks the kernel)
  torch_sdpa_flash, torch_sdpa_efficient, torch_sdpa_cudnn
                the same pinned to one CUDA kernel (CUDA only)
  torch_flex    torch.nn.attention.flex_attention under torch.compile (CUDA only)
  torch_flex_cpu  the same flex_attention eager on the CPU (its reference semantics, every variant)
  torch_nn_mha  torch.nn.MultiheadAttention (multi_head_attention only)
  jax_dpa       jax.nn.dot_product_attention (XLA path; TF32 float32 matmuls on GPU, JAX's default)
  jax_dpa_cudnn jax.nn.dot_product_attention(implementation="cudnn") (CUDA only)
  jax_pallas_flash  the Pallas (Triton) flash attention of jax.experimental.pallas.ops.gpu (CUDA only)
  jax_numpy     hand-written jax.numpy, float32 matmuls at full float32 precision (CPU: float64 and float32)
  torch_scaled_mm_fp8  float8 q, k, v (both 8-bit dtypes): torch._scaled_mm for q @ k^T and P @ V with the descale
                factors as its scales, P cast to float8 after FlashAttention 3's 2^8 offset, bfloat16 out (FP8
                attention, issue 25; 8-bit cases only, CPU)

The variant keywords of sdpa (window, softcap, alibi_slopes, query_offset, query_lengths,
key_lengths; learnable_sink, sink_token_length, attention_chunk, key_leftpad; README "The
contract") are in the signature of every path that can express them; a path without one is
unsupported on the cases that use it (README, "What the built-ins taught us", says which and why).

Packed batches and paged KV caches (sdpa_varlen, sdpa_paged; issue 25): numpy_native (document masking over the
packed rows, pages gathered into a padded batch), jax_numpy (the same, jitted once per bucket of padded sizes, pages
gathered in the program) and torch_flex_cpu (flex's document masking, torch's PagedAttention over flex).

What each CUDA path refuses (SUPPORTS) and gets wrong (KNOWN_DEVIATIONS) was measured on
an H100 (torch 2.11.0+cu130, jax 0.11.2; benchmarks/gpu_probe.py and the suite's GPU runs,
README "GPU").
"""
from __future__ import annotations

import functools
import math
import warnings

import numpy as np

from . import deviations

ALL_DTYPES = ("float64", "float32", "float16", "bfloat16")


def _host_ints(x) -> np.ndarray:
    """Per-example lengths as NumPy ints (they are structure: which keys exist, not data)."""
    return np.asarray(x.cpu() if hasattr(x, "cpu") else x).astype(np.int64)


def _distance(lq: int, lk: int, query_offset: int) -> np.ndarray:
    """(lq, lk): |p_i - j|, query i at position query_offset + i, key j at j (ALiBi's distance)."""
    return np.abs((query_offset + np.arange(lq))[:, None] - np.arange(lk)[None, :])


def _positions_allowed(lq, lk, is_causal=False, window=None, query_offset=0, key_lengths=None, *,
                       sink_token_length=0, attention_chunk=None, key_leftpad=None) -> np.ndarray:
    """(B or 1, 1, lq, lk) boolean: the spec's key set (oracle.positions_allowed), key lengths and left paddings
    read off the device.

    Every built-in that has no native window, offset, chunk, padding or length option builds its mask from here:
    the position rule is the contract's, not the framework's, so it is written once."""
    from attention_conformance.conformance import oracle

    lengths = None if key_lengths is None else _host_ints(key_lengths)
    leftpad = None if key_leftpad is None else _host_ints(key_leftpad)
    return oracle.positions_allowed(lq, lk, is_causal, window, query_offset, lengths,
                                    sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                                    key_leftpad=leftpad)


# ------------------------------------------------------------------ packed and paged batches (issue 25)
# sdpa_varlen and sdpa_paged (README "The contract"). The built-ins compute them as document masking does (flex's
# idiom; what FlashAttention's kernels do tile by tile): one attention over every packed query row and key row,
# keeping a key only for a query of its own sequence, at the positions SEQUENCE_ALIGNMENT gives; not sequence by
# sequence as the oracle defines them, so the suite compares two formulations. Sequence structure (offsets, used
# lengths, block tables) is read on the host, as kernels read it before launch.
def _packed_positions(cu_seqlens_q, cu_seqlens_k, seqused_k=None, alignment: str = "bottom-right"):
    """(query sequence, query position, key sequence, key position, key used) per packed row: query row t of
    sequence b sits at t - cu_seqlens_q[b] + (Lk_b - Lq_b) bottom-right (+ 0 top-left), key row s at s -
    cu_seqlens_k[b]; a key is used while its position is below seqused_k[b] (all of the sequence's without it)."""
    starts_q, starts_k = _host_ints(cu_seqlens_q).reshape(-1), _host_ints(cu_seqlens_k).reshape(-1)
    rows_q, rows_k = np.arange(starts_q[-1]), np.arange(starts_k[-1])
    query_seq = np.searchsorted(starts_q, rows_q, side="right") - 1
    key_seq = np.searchsorted(starts_k, rows_k, side="right") - 1
    keys = np.diff(starts_k) if seqused_k is None else _host_ints(seqused_k).reshape(-1)
    offset = keys - np.diff(starts_q) if alignment == "bottom-right" else np.zeros_like(keys)
    key_position = rows_k - starts_k[key_seq]
    return (query_seq, rows_q - starts_q[query_seq] + offset[query_seq], key_seq, key_position,
            key_position < keys[key_seq])


def _sequence_keep(query_position, key_position, is_causal: bool, window) -> np.ndarray:
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


def _document_mask(cu_seqlens_q, cu_seqlens_k, seqused_k, is_causal, window, alibi_slopes, hq: int,
                   alignment: str = "bottom-right") -> np.ndarray:
    """sdpa_varlen as one sdpa mask over the packed rows, (1, 1, total_q, total_k) boolean, or with ALiBi (1, Hq,
    total_q, total_k) float64: -slope[b, h] * |position distance| on the kept keys, -inf elsewhere (ALiBi comes
    after softcap in sdpa.variant-order, as a float mask does)."""
    query_seq, query_position, key_seq, key_position, used = _packed_positions(cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                                              alignment)
    keep = (query_seq[:, None] == key_seq[None, :]) & used[None, :] \
        & _sequence_keep(query_position[:, None], key_position[None, :], is_causal, window)
    if alibi_slopes is None:
        return keep[None, None]
    slopes = _host_floats(alibi_slopes)
    per_row = (slopes[query_seq] if slopes.ndim == 2 else np.broadcast_to(slopes, (len(query_seq), hq))).T
    distance = np.abs(query_position[:, None] - key_position[None, :])
    return np.where(keep, -per_row[:, :, None] * distance, -np.inf)[None]


def _paged_gather(cache, block_table):
    """Every page of each sequence's table, in table order: (B, max_blocks * block_size, Hkv, D) (the unused entries
    of a table name some page: gathered, then masked by seqused_k)."""
    table = _host_ints(block_table)
    gathered = cache[table.reshape(-1)] if isinstance(cache, np.ndarray) else cache[table.reshape(-1).tolist()]
    return gathered.reshape((table.shape[0], table.shape[1] * cache.shape[1]) + tuple(cache.shape[2:]))


def _paged_mask(seqused_k, lq: int, keys: int, is_causal, window, alibi_slopes, hq: int,
                alignment: str = "bottom-right") -> np.ndarray:
    """sdpa_paged's mask over the gathered keys, (B, 1, Lq, keys) boolean, or with ALiBi (B, Hq, Lq, keys) float64."""
    used = _host_ints(seqused_k).reshape(-1, 1, 1, 1)
    query_position = np.arange(lq).reshape(1, 1, lq, 1) + ((used - lq) if alignment == "bottom-right" else 0)
    key_position = np.arange(keys).reshape(1, 1, 1, keys)
    keep = (key_position < used) & _sequence_keep(query_position, key_position, is_causal, window)
    if alibi_slopes is None:
        return keep
    slopes = _host_floats(alibi_slopes)
    slopes = slopes.reshape((1,) * (2 - slopes.ndim) + slopes.shape + (1, 1))
    return np.where(keep, -slopes * np.abs(query_position - key_position), -np.inf)


def _host_floats(x) -> np.ndarray:
    return np.asarray(x.cpu() if hasattr(x, "cpu") else x).astype(np.float64)


# jax_numpy's sdpa buckets (_Buckets): a case whose padded entries, heads and lengths hold at most this many scores is
# padded further, to at least 4 (batch entry, kv head) pairs and 4 query heads per kv head.
SMALL_BUCKET_SCORES = 2**16


def _bucket(n: int, least: int) -> int:
    """The bucket a size is padded to for a compiling path: the next power of two, at least ``least``, so that XLA
    compiles once per bucket, not once per packed length or cache size (what serving stacks do for CUDA graphs)."""
    return max(least, 1 << max(int(n) - 1, 0).bit_length())


def _padded(array: np.ndarray, shape: tuple[int, ...], fill=0) -> np.ndarray:
    """``array`` in the leading corner of an array of ``shape`` filled with ``fill``."""
    out = np.full(shape, fill, dtype=array.dtype)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out


class _HeadBucket:
    """Query heads (Hkv kv heads of ``group`` query heads each) padded to a bucket of Hkv2 kv heads of group2 query
    heads, each power of two at least 4 (sdpa_varlen and sdpa_paged of jax_numpy; _Buckets does the same for sdpa):
    one program for every head layout of a small case. A padded kv head holds zeros, a padded query head is cut."""

    def __init__(self, hq: int, hkv: int):
        if hq % hkv:
            raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
        self.hkv, self.group = hkv, hq // hkv
        self.hkv2, self.group2 = _bucket(hkv, 4), _bucket(self.group, 4)

    def query(self, x: np.ndarray, axis: int, fill=0) -> np.ndarray:
        """x with its Hq axis ``axis`` padded to Hkv2 * group2, query head h of kv head h // group kept in place."""
        x = np.moveaxis(np.asarray(x), axis, 0)
        grouped = x.reshape((self.hkv, self.group) + x.shape[1:])
        padded = _padded(grouped, (self.hkv2, self.group2) + x.shape[1:], fill)
        return np.moveaxis(padded.reshape((self.hkv2 * self.group2,) + x.shape[1:]), 0, axis)

    def real(self, x: np.ndarray, axis: int) -> np.ndarray:
        """The real Hq heads of a padded Hkv2 * group2 axis ``axis``."""
        x = np.moveaxis(np.asarray(x), axis, 0)
        x = x.reshape((self.hkv2, self.group2) + x.shape[1:])[:self.hkv, :self.group]
        return np.moveaxis(x.reshape((self.hkv * self.group,) + x.shape[2:]), 0, axis)


def _per_row_slopes(alibi_slopes, query_seq: np.ndarray, hq: int) -> np.ndarray:
    """(Hq, rows): each packed query row's ALiBi slopes (its sequence's row of (B, Hq), or the (Hq,) ones); 0 without."""
    if alibi_slopes is None:
        return np.zeros((hq, len(query_seq)))
    slopes = _host_floats(alibi_slopes)
    return np.array((slopes[query_seq] if slopes.ndim == 2 else np.broadcast_to(slopes, (len(query_seq), hq))).T)


def _sink_4d(learnable_sink, hq: int):
    """The learnable sink logits (Hq,) as (1, Hq, 1, 1), in their own array type (sdpa.learnable-sink)."""
    if tuple(learnable_sink.shape) != (hq,):
        raise ValueError(f"learnable_sink has shape {tuple(learnable_sink.shape)}; (Hq,) = ({hq},) expected")
    return learnable_sink.reshape(1, hq, 1, 1)


def _slopes_4d(slopes, hq: int):
    """ALiBi slopes (Hq,) or (B, Hq) as (1 or B, Hq, 1, 1), in the slopes' own array type."""
    return slopes.reshape((1,) * (2 - slopes.ndim) + tuple(slopes.shape) + (1, 1))


def _head_groups(q, k) -> int:
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    return hq // hkv


def _split_heads(x, num_heads, xp):
    b, length, width = x.shape
    return xp.swapaxes(x.reshape(b, length, num_heads, width // num_heads), 1, 2)


def _merge_heads(x, xp):
    b, h, length, width = x.shape
    return xp.swapaxes(x, 1, 2).reshape(b, length, h * width)


def _project(x, params, name):
    y = x @ params["w_" + name]
    bias = params.get("b_" + name)
    return y if bias is None else y + bias


def _mha_with(sdpa, query, key, value, params, num_heads, mask, is_causal, xp, **variants):
    """Multi-head attention over any sdpa; the array namespace xp supplies reshape helpers. ``variants``: the variant
    keywords a case uses (mha.variants), handed to each head's sdpa after the projections."""
    q = _split_heads(_project(query, params, "q"), num_heads, xp)
    k = _split_heads(_project(key, params, "k"), num_heads, xp)
    v = _split_heads(_project(value, params, "v"), num_heads, xp)
    context = sdpa(q, k, v, mask=mask, is_causal=is_causal, **variants)
    return _project(_merge_heads(context, xp), params, "o")


def _used(**variants) -> dict:
    """The variant keywords of a multi_head_attention call that differ from their defaults (the ones a case uses),
    to hand to its sdpa: an sdpa without one of the others then still runs the case."""
    from attention_conformance.conformance import oracle

    return oracle.variant_options(variants)


def _differentiated_eagerly(*arrays) -> bool:
    """Whether every tracer among ``arrays`` is one of an eager jax.vjp / jax.jvp (its primal a concrete array), not
    of a jit: a custom_vjp's rules then get concrete arrays, which can be padded on the host."""
    import jax

    tracers = [a for a in arrays if isinstance(a, jax.core.Tracer)]
    primals = [getattr(a, "primal", None) for a in tracers]  # JVP and linearize tracers have one
    return bool(tracers) and all(p is not None and not isinstance(p, jax.core.Tracer) for p in primals)


class _Buckets:
    """One sdpa case of concrete arrays laid out in its bucket (JaxNumpy._sdpa_in_buckets). Each (batch entry, kv
    head) pair is one entry of the program's batch axis, with one kv head and its group of query heads (GQA's heads
    are independent given their kv head): entries and query heads per kv head are padded on the host to powers of two
    (at least 4 for a small case, of at most SMALL_BUCKET_SCORES padded scores, else at least 2), lengths to powers of
    two from 32, head dims from 64. Every option is an array (JaxNumpy._uniform_options), neutral where unused;
    the attended keys (keep), the float mask, ALiBi slopes and sink logits go with their entry. The padded keys are
    not kept, the padded head-dim columns are zeros (their products add 0), the padded query rows, heads and entries
    (no key kept: zeros) are cut off: the same arithmetic on the real rows, up to the order of XLA's sums
    (within the tolerance model, which holds for any order). Over jax_numpy's tests in one process this layout
    makes 22 forward programs where batch, kv heads and group padded apart (head dims from 32) made 35, with less
    padded work (4.7 against 6.4 G multiply-adds). ``padded``: (q, k, v); ``options``: _sdpa_uniform's other
    arguments by name."""

    def __init__(self, q, k, v, mask, is_causal, scale, **variants):
        q, k, v = (np.asarray(x) for x in (q, k, v))
        (self.b, self.hq, self.lq, self.dk), (self.hkv, self.lk, self.dv) = q.shape, (k.shape[1], k.shape[2],
                                                                                      v.shape[3])
        self.group, self.entries = _head_groups(q, k), self.b * self.hkv
        self.rows, self.keys = _bucket(self.lq, 32), _bucket(self.lk, 32)
        self.dk2, self.dv2 = _bucket(self.dk, 64), _bucket(self.dv, 64)
        small = self.rows * self.keys * _bucket(self.entries, 4) * _bucket(self.group, 4) <= SMALL_BUCKET_SCORES
        least = 4 if small else 2
        self.entries2, self.group2 = _bucket(self.entries, least), _bucket(self.group, least)
        options = JaxNumpy._uniform_options(np, q, k, None if mask is None else np.asarray(mask), is_causal, scale,
                                            **variants)
        options.update(keep=self.heads(options["keep"], (self.rows, self.keys), False),
                       bias=self.heads(options["bias"], (self.rows, self.keys)),
                       slopes=self.heads(options["slopes"], ()), sink=self.heads(options["sink"], ()))
        self.options = options
        kv = (self.entries2, 1, self.keys)
        self.padded = (self.heads(q, (self.rows, self.dk2)),
                       _padded(k.reshape(self.entries, 1, self.lk, self.dk), kv + (self.dk2,)),
                       _padded(v.reshape(self.entries, 1, self.lk, self.dv), kv + (self.dv2,)))

    def heads(self, x, trailing, fill=0):
        """(B, Hq, ...) -> (entries2, group2, *trailing): entry b * Hkv + kv holds kv head kv's query heads of b."""
        x = np.asarray(x)
        return _padded(x.reshape((self.entries, self.group) + x.shape[2:]), (self.entries2, self.group2) + trailing,
                       fill)

    def _real(self, x, *sizes) -> np.ndarray:
        """The real (B, Hq, ...) part of a padded (entries2, group2, ...) array, cut on the host (a slice of a jax
        array compiles, and so does jnp.asarray of a numpy array)."""
        x = np.asarray(x)[(slice(self.entries), slice(self.group)) + tuple(slice(n) for n in sizes)]
        return np.ascontiguousarray(x.reshape((self.b, self.hq) + x.shape[2:]))

    def output(self, out) -> np.ndarray:
        """The (B, Hq, Lq, Dv) output of the padded (entries2, group2, rows, dv2) one."""
        return self._real(out, self.lq, self.dv)

    def padded_output(self, d_out) -> np.ndarray:
        """An upstream gradient of the output, padded with zeros: the padding contributes nothing."""
        return self.heads(d_out, (self.rows, self.dv2))

    def gradients(self, grads, bias, sink) -> tuple:
        """(dq, dk, dv, dbias, dsink) of the real arguments, from the bucket's: each cut, dbias summed to the float
        mask's own (broadcast) shape, dsink over the batch to (Hq,); None for an argument that was not given."""
        import jax

        from attention_conformance.conformance.oracle_backward import reduce_to_shape

        dq, dk, dv, dbias, dsink = (np.asarray(g) for g in grads)
        kv = (self.b, self.hkv)
        out = [self._real(dq, self.lq, self.dk), dk[:self.entries, 0, :self.lk, :self.dk].reshape(kv + (self.lk,
                                                                                                       self.dk)),
               dv[:self.entries, 0, :self.lk, :self.dv].reshape(kv + (self.lk, self.dv)), None, None]
        if bias is not None:
            out[3] = reduce_to_shape(self._real(dbias, self.lq, self.lk), tuple(bias.shape)).astype(bias.dtype)
        if sink is not None:
            out[4] = self._real(dsink).sum(axis=0).astype(sink.dtype)
        return tuple(None if g is None else jax.device_put(np.ascontiguousarray(g)) for g in out)


_JITTED: dict = {}


def _softmax_in_buckets(body, x, axis: int):
    """``body`` (a softmax over ``axis``) jitted, as one program per bucket of sizes for concrete arrays (as
    jax_numpy's _sdpa_in_buckets): the axis moved last and the rest flattened to rows on the host, the rows padded
    to a power of two (at least 32) and cut off after, the axis padded likewise with -inf, which adds exp(-inf) = 0
    to every sum (jax_numpy: 51 -> 11 XLA compiles over its tests in one process with buckets from 8; 12 -> 8 with
    buckets from 32). Traced or empty arrays take the plain jitted body."""
    if _traced(x) or not np.size(x):
        return _jitted(body, "axis")(x, axis=axis)
    import jax

    moved = np.moveaxis(np.asarray(x), axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    padded = _padded(rows, (_bucket(rows.shape[0], 32), _bucket(rows.shape[1], 32)), -np.inf)
    padded[rows.shape[0]:] = 0  # whole padding rows: finite, never read
    out = np.asarray(_jitted(body, "axis")(padded, axis=-1))[:rows.shape[0], :rows.shape[1]]
    return jax.device_put(np.ascontiguousarray(np.moveaxis(out.reshape(moved.shape), -1, axis)))


def _jitted(fn, *static: str):
    """jax.jit of ``fn`` with the named arguments static, built once (on the CPU with CPU_COMPILER_OPTIONS).

    XLA compiles once per distinct shape/dtype signature (about 0.1 s on a 2-core
    CPU); op-by-op dispatch would compile every primitive separately for each new
    shape, several times slower. Only structure is static (is_causal, an axis, the
    head count): a scale is traced, so a new scale value does not recompile.
    """
    if (fn, static) not in _JITTED:  # the same body jitted with more static arguments is another program
        _JITTED[(fn, static)] = _Jitted(fn, static_argnames=static)
    return _JITTED[(fn, static)]


# The built-ins' XLA:CPU programs are compiled with the elemental emitters instead of the MLIR fusion emitters
# (XLA's default): the same HLO, the same bits, 40 % less compile time. Measured on jax 0.10.2 with a fixed
# Hypothesis seed: all 2,184 results of the JAX built-ins' calls in a default run (forward, gradients, multi-head,
# softmax, float64) bit for bit those of the default emitters; the 60 distinct jax_dpa programs of a run compiled
# in 2.43 s against 4.06 s. A cold default run compiles about 230 such programs (README, "Speed"). Only the
# built-ins' own programs, only on the CPU: a user's implementation compiles as it would anywhere.
# tests/test_jax_compiler_options.py holds the built-ins to the same bits both ways.
CPU_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}


@functools.cache
def cpu_compiler_options() -> dict | None:
    """CPU_COMPILER_OPTIONS where this jaxlib takes them and a probe program (scores, mask, softmax, tanh, and
    their gradients) gives the same bits as with XLA's defaults; None otherwise (another jaxlib: its defaults)."""
    import jax
    import jax.numpy as jnp

    def probe(q, k, v, bias):
        scores = jnp.tanh(q @ jnp.swapaxes(k, -1, -2) * 0.3) * 5.0 + bias
        weights = jax.nn.softmax(jnp.where(bias > -1.0, scores, -jnp.inf), axis=-1)
        return jnp.sum((weights @ v) ** 2)

    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(np.float32)
              for shape in ((2, 3, 17, 24), (2, 3, 19, 24), (2, 3, 19, 13), (2, 1, 17, 19))]
    try:
        cpu = jax.devices("cpu")[0]
        inputs = [jax.device_put(x, cpu) for x in inputs]
        program = jax.value_and_grad(probe, argnums=(0, 1, 2))
        tuned = jax.jit(program, compiler_options=CPU_COMPILER_OPTIONS)(*inputs)
    except Exception:  # noqa: BLE001 -- an option this jaxlib does not know: its defaults
        return None
    default = jax.jit(program)(*inputs)
    leaves = zip(jax.tree_util.tree_leaves(tuned), jax.tree_util.tree_leaves(default))
    same = all(np.asarray(a).tobytes() == np.asarray(b).tobytes() for a, b in leaves)
    return dict(CPU_COMPILER_OPTIONS) if same else None


class _Jitted:
    """A body jitted twice at most: with cpu_compiler_options() for arguments that live on the CPU, plain for
    others (a GPU's, or a trace's, whose enclosing program is compiled by its own options)."""

    def __init__(self, fn, **jit_options):
        self.fn, self.jit_options, self.by_platform = fn, jit_options, {}

    def __call__(self, *args, **kwargs):
        on_cpu = _on_cpu(args)
        if on_cpu not in self.by_platform:
            import jax

            options = cpu_compiler_options() if on_cpu else None
            self.by_platform[on_cpu] = jax.jit(self.fn, **self.jit_options, compiler_options=options)
        return self.by_platform[on_cpu](*args, **kwargs)


def _on_cpu(args) -> bool:
    """Whether the program these arguments start compiles for the CPU: their first JAX array lives there (not a
    tracer), or, of host arrays only, JAX's default backend is the CPU."""
    import jax

    for leaf in jax.tree_util.tree_leaves(args):
        if isinstance(leaf, jax.core.Tracer):
            return False
        if isinstance(leaf, jax.Array):
            return all(device.platform == "cpu" for device in leaf.devices())
    return jax.default_backend() == "cpu"


def _traced(*arrays) -> bool:
    """Whether any of the arrays is a JAX tracer (inside jax.vjp or jit): its values are not on the host."""
    import jax

    return any(isinstance(a, jax.core.Tracer) for a in arrays if a is not None)


def _jax_sdpa(body, q, k, v, mask, is_causal, scale):
    """Call a jitted sdpa body: the scale travels as a traced scalar (None stays static)."""
    if scale is not None:
        scale = np.float64(scale)  # each body rounds it to q's dtype, as a Python float would be
    return _jitted(body, "is_causal")(q, k, v, mask, is_causal=is_causal, scale=scale)


# Variant keywords that are structure (a compile each), not arrays: static in a jitted body.
JAX_STATIC_VARIANTS = ("window", "softcap", "query_offset", "sink_token_length", "attention_chunk")


def _jax_mha(sdpa_body, query, key, value, params, num_heads, mask, is_causal, **variants):
    """Multi-head attention around an sdpa body, the whole pipeline one jitted XLA program. ``variants``: keywords
    of the body (mha.variants), those of JAX_STATIC_VARIANTS static (hashable), the others traced arrays."""
    if ("mha", sdpa_body) not in _JITTED:
        import jax.numpy as jnp

        def mha(query, key, value, params, mask, arrays, num_heads, is_causal, static):
            def sdpa(q, k, v, mask=None, is_causal=False, **extra):
                return sdpa_body(q, k, v, mask, is_causal=is_causal, scale=None, **extra)

            return _mha_with(sdpa, query, key, value, params, num_heads, mask, is_causal, jnp, **arrays,
                             **dict(static))

        _JITTED[("mha", sdpa_body)] = _Jitted(mha, static_argnames=("num_heads", "is_causal", "static"))
    static = tuple(sorted((n, v) for n, v in variants.items() if n in JAX_STATIC_VARIANTS))
    arrays = {n: v for n, v in variants.items() if n not in JAX_STATIC_VARIANTS}
    return _JITTED[("mha", sdpa_body)](query, key, value, params, mask, arrays, num_heads=num_heads,
                                       is_causal=is_causal, static=static)


class NumpyOracle:
    NAME = "numpy_oracle"
    ARRAY = "numpy"
    DTYPES = ("float64",)

    @staticmethod
    def softmax(x, axis=-1):
        from attention_conformance.conformance import oracle

        return oracle.softmax(x, axis=axis)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None):
        from attention_conformance.conformance import oracle

        variants = oracle.variant_options(dict(window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                               query_offset=query_offset, query_lengths=query_lengths,
                                               key_lengths=key_lengths, learnable_sink=learnable_sink,
                                               sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                                               key_leftpad=key_leftpad))
        return oracle.sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale, **variants)

    @staticmethod
    def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                             learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
        from attention_conformance.conformance import oracle

        return oracle.multi_head_attention(query, key, value, params, num_heads, mask=mask, is_causal=is_causal,
                                           **_used(window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                                   query_offset=query_offset, query_lengths=query_lengths,
                                                   key_lengths=key_lengths, learnable_sink=learnable_sink,
                                                   sink_token_length=sink_token_length,
                                                   attention_chunk=attention_chunk, key_leftpad=key_leftpad))


def _accumulator(dtype: np.dtype) -> np.dtype:
    """Sums of 16-bit values accumulate in float32 and are rounded once, as kernels (and NumPy's own 16-bit
    matmuls) do: np.sum(dtype=bfloat16) rounds after every addition (4096 ones sum to 256), which put this
    built-in's bfloat16 decode output off by 84 % at Lk 2048 (found calibrating the 16-bit tolerance)."""
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


class NumpyNative:
    """The oracle's math in the input dtype: every intermediate is rounded to it.

    Matmuls and sums of 16-bit values accumulate in float32 and are rounded once
    (NumPy's float16 and bfloat16 matmuls do so themselves; sums are asked to); the
    score scale * q.k is one intermediate, scaled in the accumulator.
    """

    NAME = "numpy_native"
    ARRAY = "numpy"
    DTYPES = ALL_DTYPES

    @staticmethod
    def softmax(x, axis=-1):
        dtype = x.dtype
        shifted = (x - np.max(x, axis=axis, keepdims=True)).astype(dtype)
        e = np.exp(shifted).astype(dtype)
        total = np.sum(e, axis=axis, keepdims=True, dtype=_accumulator(dtype)).astype(dtype)
        return (e / total).astype(dtype)

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None):
        # query_lengths only marks padding rows, which the contract does not judge: every row is computed.
        dtype = q.dtype
        group = _head_groups(q, k)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        lq, lk = q.shape[-2], k.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        # The score scale * q.k is one intermediate, rounded once: q.k accumulated and scaled in the accumulator (an
        # outlier channel takes the unscaled q.k past float16's range while the score stays inside it). A 16-bit score
        # may still overflow to inf: at a removed key (test_masked_keys_have_no_influence scales the dead keys' k) it
        # is masked below; at an attended one it reaches the output, where the judge sees it. No warning.
        acc = _accumulator(dtype)
        with np.errstate(over="ignore"):
            scores = ((q.astype(acc) @ np.swapaxes(k, -1, -2).astype(acc)) * acc.type(scale)).astype(dtype)
        if softcap is not None:
            cap = dtype.type(softcap)
            # A 16-bit score far past the cap (a packed batch's unused keys, masked below) overflows s / cap to inf,
            # whose tanh is 1: the saturated value, not worth a warning.
            with np.errstate(over="ignore"):
                scores = (np.tanh((scores / cap).astype(dtype)).astype(dtype) * cap).astype(dtype)
        if alibi_slopes is not None:
            distance = _distance(lq, lk, query_offset).astype(dtype)
            scores = (scores - (_slopes_4d(alibi_slopes, q.shape[1]).astype(dtype) * distance).astype(dtype))
            scores = scores.astype(dtype)
        allowed = _positions_allowed(lq, lk, is_causal, window, query_offset, key_lengths,
                                     sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                                     key_leftpad=key_leftpad)
        if mask is not None and mask.dtype == np.bool_:
            allowed = allowed & mask
        elif mask is not None:
            scores = (scores + mask).astype(dtype)
        scores = np.where(allowed, scores, dtype.type(-np.inf))
        row_max = np.max(scores, axis=-1, keepdims=True)
        sink = None
        if learnable_sink is not None:  # the sink logit joins the maximum and the normaliser, in the input dtype
            sink = _sink_4d(learnable_sink, q.shape[1]).astype(dtype)
            row_max = np.maximum(row_max, sink)
        empty = np.isneginf(row_max)
        # In float16 a row spanning more than the dtype's range makes scores - max overflow to -inf,
        # whose exp is the right weight, 0: not worth a warning.
        with np.errstate(over="ignore"):
            e = np.exp((scores - np.where(empty, 0, row_max)).astype(dtype)).astype(dtype)
            total = np.sum(e, axis=-1, keepdims=True, dtype=_accumulator(dtype))
            if sink is not None:
                total = total + np.exp((sink - row_max).astype(dtype)).astype(dtype)
        weights = (e / np.where(empty, 1, total.astype(dtype))).astype(dtype)
        return (weights @ v).astype(dtype)

    @classmethod
    def sdpa_varlen(cls, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                    scale=None, *, seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
        # Document masking: one sdpa over the packed rows (batch 1), the sequences kept apart by the mask.
        mask = _document_mask(cu_seqlens_q, cu_seqlens_k, seqused_k, is_causal, window, alibi_slopes, q.shape[1])
        out = cls.sdpa(np.swapaxes(q, 0, 1)[None], np.swapaxes(k, 0, 1)[None], np.swapaxes(v, 0, 1)[None],
                       mask=mask if mask.dtype == np.bool_ else mask.astype(q.dtype),
                       scale=1.0 / math.sqrt(q.shape[-1]) if scale is None else scale, softcap=softcap,
                       learnable_sink=learnable_sink)
        return np.ascontiguousarray(np.swapaxes(out[0], 0, 1))

    @classmethod
    def sdpa_paged(cls, q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
                   softcap=None, alibi_slopes=None, learnable_sink=None):
        # Each sequence's pages gathered into a padded batch, the keys past seqused_k masked.
        k = np.swapaxes(_paged_gather(k_cache, block_table), 1, 2)
        v = np.swapaxes(_paged_gather(v_cache, block_table), 1, 2)
        mask = _paged_mask(seqused_k, q.shape[2], k.shape[2], is_causal, window, alibi_slopes, q.shape[1])
        return cls.sdpa(q, k, v, mask=mask if mask.dtype == np.bool_ else mask.astype(q.dtype), scale=scale,
                        softcap=softcap, learnable_sink=learnable_sink)

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                             learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
        dtype = query.dtype
        rounded = {name: p for name, p in params.items()}

        def project(x, name):
            return _project(x, rounded, name).astype(dtype)

        q = _split_heads(project(query, "q"), num_heads, np)
        k = _split_heads(project(key, "k"), num_heads, np)
        v = _split_heads(project(value, "v"), num_heads, np)
        context = cls.sdpa(q, k, v, mask=mask, is_causal=is_causal, window=window, softcap=softcap,
                           alibi_slopes=alibi_slopes, query_offset=query_offset, key_lengths=key_lengths,
                           learnable_sink=learnable_sink, sink_token_length=sink_token_length,
                           attention_chunk=attention_chunk, key_leftpad=key_leftpad)
        return project(_merge_heads(context, np), "o")


class TorchMath:
    """Hand-written torch: q scaled, matmul, masked_fill, softmax, matmul, in the input dtype."""

    NAME = "torch_math"
    ARRAY = "torch"
    DTYPES = ALL_DTYPES

    @staticmethod
    def softmax(x, axis=-1):
        import torch

        return torch.softmax(x, dim=axis)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None):
        import torch

        group = _head_groups(q, k)
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        lq, lk = q.shape[-2], k.shape[-2]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        # q scaled first (as BART, Whisper and Flax do): q @ k^T of an outlier channel passes float16's range where
        # the scaled score does not (Hugging Face's eager q @ k^T * scaling overflows there).
        scores = (q * scale) @ k.transpose(-1, -2)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if alibi_slopes is not None:
            distance = torch.from_numpy(_distance(lq, lk, query_offset)).to(q.device)
            scores = scores - (_slopes_4d(alibi_slopes, q.shape[1]) * distance).to(scores.dtype)
        allowed = torch.from_numpy(_positions_allowed(lq, lk, is_causal, window, query_offset, key_lengths,
                                                      sink_token_length=sink_token_length,
                                                      attention_chunk=attention_chunk, key_leftpad=key_leftpad))
        allowed = allowed.to(q.device)
        if mask is not None and mask.dtype == torch.bool:
            allowed = allowed & mask
        elif mask is not None:
            scores = scores + mask
        scores = scores.masked_fill(~allowed, float("-inf"))
        if learnable_sink is not None:
            # gpt-oss's form: the sink is one more column of the scores, its weight dropped before @ v.
            sink = _sink_4d(learnable_sink, q.shape[1]).to(scores.dtype).expand(*scores.shape[:-1], 1)
            return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1] @ v
        # A row with no attendable key is 0/0 in softmax; the contract says zeros. Its scores are replaced before the
        # softmax, not only its weights after: a softmax of -inf rows has NaN weights whose backward is NaN (times a
        # zero upstream gradient), which reached dq, dk and a float mask's gradient.
        empty = scores.isneginf().all(-1, keepdim=True)
        weights = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
        return weights @ v

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                             learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
        import torch

        return _mha_with(cls.sdpa, query, key, value, params, num_heads, mask, is_causal, torch,
                         **_used(window=window, softcap=softcap, alibi_slopes=alibi_slopes, query_offset=query_offset,
                                 key_lengths=key_lengths, learnable_sink=learnable_sink,
                                 sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                                 key_leftpad=key_leftpad))


def _cuda_16bit(facts) -> bool:
    return facts["device"] == "cuda" and facts["dtype"] in ("float16", "bfloat16")


def _nonpositive_scale(facts) -> bool:
    return facts["scale"] is not None and facts["scale"] <= 0


# One kernel defect surfaces through every clause whose property draws a case that reaches it.
FORWARD_VALUE_CLAUSES = ("sdpa.finite", "sdpa.definition", "sdpa.any-length", "sdpa.scale-explicit",
                         "sdpa.scale-default", "sdpa.gqa-mapping", "sdpa.cross-attention", "sdpa.value-dim",
                         "causal.top-left", "causal.first-row", "causal.bottom-right-explicit", "mask.bool-true-attends",
                         "mask.float-additive", "mask.broadcast", "mask.before-softmax", "softmax.large-inputs",
                         "softmax.shift-invariance", "sdpa.key-permutation-invariance",
                         "sdpa.batch-head-independence", "sdpa.convex-combination", "dropout.p-zero")
GRADIENT_CLAUSES = ("grad.sdpa-q", "grad.sdpa-k", "grad.sdpa-v", "grad.mask", "grad.gqa-sum")

CUDA_NAN_NONPOSITIVE_SCALE = {
    "clause": FORWARD_VALUE_CLAUSES + GRADIENT_CLAUSES,
    "when": lambda facts: _cuda_16bit(facts) and _nonpositive_scale(facts),
    "reason": "H100, torch 2.11+cu130 / jax 0.11.2: the flash and cuDNN kernels (and torch's default dispatch, which "
    "picks cuDNN for 16-bit inputs) return NaN for a scale of 0 or below in float16/bfloat16, forward and backward "
    "(they assume a positive scale when they fold it into the exponent); the math kernel is right",
}
CUDA_CUDNN_FULLY_MASKED_ROWS = {
    "clause": ("mask.fully-masked-row", "mha.projections"),
    "when": lambda facts: _cuda_16bit(facts) and facts["fully_masked"],
    "reason": "H100, torch 2.11+cu130 / jax 0.11.2: cuDNN attention returns finite wrong values (errors 0.2 to 4 "
    "against zeros) for a row whose boolean mask attends no key (also inside multi-head attention)",
}
CUDA_16BIT_KERNEL_DEVIATIONS = (CUDA_NAN_NONPOSITIVE_SCALE, CUDA_CUDNN_FULLY_MASKED_ROWS)
# benchmarks/score_range_probe.py on an H200 (torch 2.11+cu130, 2026-11-27), after the suite's H100 run failed
# torch_sdpa_cudnn's outlier case (Dk 8, key padding with the causal band folded in: error 1.5 against 4.3e-3 allowed).
CUDA_CUDNN_FINITE_MASK_FILL = {
    "clause": "sdpa.score-range",
    "when": lambda facts: facts["device"] == "cuda" and facts["dtype"] == "float16" and facts["mask_kind"] != "none",
    "reason": "H100 and H200, torch 2.11+cu130: with a mask, torch's cuDNN attention (and the default dispatch, which "
    "picks it for float16) holds a removed key at a finite fill of at most 65504 below its score, not -inf, so where "
    "the scaled scores of one row span more than that (Dk 8: +-3.5e4) a removed key outweighs the kept ones. The "
    "suite's failing case is reproduced to its largest error (1.743) by any fill from -1e4 to -65504 and not by -1e5; "
    "the same output with q scaled beforehand, right without a mask and with cuDNN's own causal band, right at Dk 16 "
    "(+-2.5e4); the efficient kernel and JAX's cuDNN path are right on the same inputs",
}
# benchmarks/cudnn_backward_probe.py replayed the failing cases of the suite's first GPU run of torch_sdpa_cudnn.
CUDA_CUDNN_MASKED_BACKWARD_NAN = {
    "clause": "grad.sdpa-q",
    "when": lambda facts: _cuda_16bit(facts) and facts["mask_kind"] != "none",
    "reason": "H200, torch 2.11+cu130: cuDNN attention's backward returns NaN for a whole row of dq (the analytic "
    "gradient finite, 0 or -3.7e-98) where a mask (the causal band folded in) leaves the row's softmax one-hot to "
    "float32 precision: one attended key, or the others 1e-98 and less below it (an explicit scale of 2.5, or large "
    "scores); failed in both GPU runs; in isolation 3 of 3 calls, with enable_gqa or repeated kv heads, the mask "
    "boolean or a float -inf bias alike; 0 of 80 random unit-score cases. dk and dv of those rows not measured",
}


class TorchSDPA:
    """torch.nn.functional.scaled_dot_product_attention (whichever kernel torch picks)."""

    NAME = "torch_sdpa"
    ARRAY = "torch"
    DTYPES = ALL_DTYPES
    KNOWN_DEVIATIONS = (
        {
            "clause": "sdpa.finite",
            "when": lambda facts: facts["device"] == "cpu" and facts["is_causal"] and facts["mask_kind"] == "none"
            and facts["scale"] is not None and facts["scale"] <= 0,
            "reason": "torch 2.13 CPU: is_causal=True with a scale <= 0 returns NaN from the default (flash) CPU "
            "kernel (it scales the -inf of masked scores: -inf * 0 and -inf * -s); the same causal band as an "
            "explicit mask, and the math backend, give the right result",
        },
        {
            "clause": FORWARD_VALUE_CLAUSES + GRADIENT_CLAUSES,
            "when": lambda facts: facts["device"] == "cpu" and facts["is_causal"] and facts["mask_kind"] == "none"
            and facts["scale"] is not None and facts["scale"] < 0 and facts["dtype"] in ("float16", "bfloat16")
            and facts["Lk"] % 8 == 0,
            "reason": "torch 2.13 CPU, the same kernel with a negative scale in float16/bfloat16: where Lk is a "
            "multiple of 8 the causal rows come out finite and wrong (0, or a mix of the wrong keys) instead of NaN "
            "(measured for Lq 1-9, Lk 1-19: Lk 8 and 16 wrong, the other Lk > 1 NaN); seen by every property that "
            "draws such a case, gradients included",
        },
    ) + CUDA_16BIT_KERNEL_DEVIATIONS + (CUDA_CUDNN_FINITE_MASK_FILL,)

    @staticmethod
    def softmax(x, axis=-1):
        import torch.nn.functional as F

        return F.softmax(x, dim=axis)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0, *, window=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None):
        # No softcap: SDPA has no hook between q.k and the mask, so softcap cases are unsupported. The causal
        # band with an offset, windows and key lengths reach SDPA as its boolean attn_mask, ALiBi as its float
        # attn_mask (the bias plus any float mask): a test of SDPA's mask paths, not of a native variant.
        import torch
        import torch.nn.functional as F

        if window is not None or alibi_slopes is not None or query_offset or key_lengths is not None:
            lq, lk = q.shape[-2], k.shape[-2]
            allowed = torch.from_numpy(_positions_allowed(lq, lk, is_causal, window, query_offset, key_lengths))
            allowed = allowed.to(q.device)
            if mask is not None and mask.dtype == torch.bool:
                allowed, mask = allowed & mask, None
            if alibi_slopes is not None:
                distance = torch.from_numpy(_distance(lq, lk, query_offset)).to(q.device)
                bias = -(_slopes_4d(alibi_slopes, q.shape[1]) * distance).to(q.dtype)
                mask = bias if mask is None else bias + mask
            mask = allowed if mask is None else torch.where(allowed, mask, float("-inf"))
            is_causal = False
        if is_causal and mask is not None:
            # Some torch kernels refuse attn_mask with is_causal ("Explicit attn_mask should
            # not be set when is_causal=True"); the contract intersects them, so fold the
            # causal band into the mask here.
            band = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            mask = mask & band if mask.dtype == torch.bool else mask.masked_fill(~band, float("-inf"))
            is_causal = False
        if mask is not None and mask.shape[-1] != k.shape[-2]:
            # A mask broadcast along the keys (last dim 1): the memory-efficient CUDA kernel refuses it
            # ("(*bias): last dimension must be contiguous"); the contract allows it, so expand it here.
            mask = mask.expand(*mask.shape[:-1], k.shape[-2]).contiguous()
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None):
        # The variants its sdpa takes (no softcap, no sinks, chunks or left padding: SDPA has no hook for them).
        import torch

        return _mha_with(cls.sdpa, query, key, value, params, num_heads, mask, is_causal, torch,
                         **_used(window=window, alibi_slopes=alibi_slopes, query_offset=query_offset,
                                 key_lengths=key_lengths))


class _TorchSDPAKernel(TorchSDPA):
    """torch SDPA pinned to one CUDA kernel with torch.nn.attention.sdpa_kernel.

    A case the kernel rejects (torch raises "No available kernel") is unsupported,
    not failed: kernels legitimately refuse some dtypes, masks and head sizes.
    """

    ARRAY = "torch"
    DEVICES = ("cuda",)
    BACKEND = ""

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        # torch says why it refused the kernel in UserWarnings, one per check: the refusal's reason is the first
        # specific one (the H200 run printed 16,251 of them, one pytest warning each, and called every refusal
        # "No available kernel").
        with sdpa_kernel(getattr(SDPBackend, cls.BACKEND)), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return TorchSDPA.sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)
            except RuntimeError as exc:
                if "No available kernel" in str(exc):
                    why = [text for text in (str(w.message).split(" (Triggered internally")[0] for w in caught)
                           if not text.endswith("not used because:") and "runtime disabled" not in text]
                    raise NotImplementedError(f"{cls.BACKEND}: {why[0] if why else str(exc).splitlines()[0]}") \
                        from None
                raise

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False):
        import torch  # the pinned kernels take no variant keyword (sdpa above)

        return _mha_with(cls.sdpa, query, key, value, params, num_heads, mask, is_causal, torch)


class TorchFlashAttention(_TorchSDPAKernel):
    NAME = "torch_sdpa_flash"
    DTYPES = ("float16", "bfloat16")
    BACKEND = "FLASH_ATTENTION"
    # Its own, not the default dispatch's (which picks cuDNN for 16 bits): the H100 and H200 runs reported 342 and 338
    # of its cases under this one entry (sdpa.finite) and no other; it takes no mask, so cuDNN's are out of its reach.
    KNOWN_DEVIATIONS = (CUDA_NAN_NONPOSITIVE_SCALE,)
    # FlashAttention-2 in torch: head dims a multiple of 8 up to 256, Dv == Dk, no attn_mask (is_causal only), and
    # is_causal only where Lq == Lk (H200, torch 2.11: "Flash attention does not support the is_causal flag when
    # seqlen_q != seqlen_k", for 74 shapes of the run).
    SUPPORTS = {"head_dims": {"min": 8, "max": 256, "multiple": 8}, "value_head_dim": "same", "masks": ["none"],
                "causal": "lq==lk"}


class TorchMemoryEfficientAttention(_TorchSDPAKernel):
    NAME = "torch_sdpa_efficient"
    DTYPES = ("float32", "float16", "bfloat16")
    BACKEND = "EFFICIENT_ATTENTION"
    # Refuses enable_gqa (H100, torch 2.11: "No available kernel" for every Hq != Hkv case), and head dims that are
    # not a multiple of 16 bytes (H200, torch 2.11: "Mem efficient attention requires last dimension of inputs to be
    # divisible by 4" in float32, "by 8" in 16 bits, for Dk or Dv; 12,538 of its cases were refused so, 2,135 judged).
    SUPPORTS = {"gqa": False, "head_dims": {"multiple": 4}}
    HEAD_DIM_MULTIPLE_16BIT = 8
    # None: right where flash and cuDNN deviate (gpu-evidence/kernels-characterized.md: scale 0 and -0.3, fully masked
    # rows, 16 bits, errors at most 1.8e-3), and 0 deviations of 3293 (H100) and 3268 (H200) judged cases in the
    # suite's runs while it inherited the default dispatch's entries. Declaring them would hide those defects.
    KNOWN_DEVIATIONS = ()

    @classmethod
    def supports(cls, facts):
        multiple = cls.HEAD_DIM_MULTIPLE_16BIT
        if facts.get("dtype") in ("float16", "bfloat16") and (facts["Dk"] % multiple or facts["Dv"] % multiple):
            return f"head dims Dk {facts['Dk']}, Dv {facts['Dv']}: in 16 bits a multiple of {multiple} (16 bytes)"
        return None


class TorchCuDNNAttention(_TorchSDPAKernel):
    NAME = "torch_sdpa_cudnn"
    DTYPES = ("float16", "bfloat16")
    BACKEND = "CUDNN_ATTENTION"
    SUPPORTS = {"head_dims": {"min": 8, "max": 256, "multiple": 8}, "value_head_dim": "same"}
    KNOWN_DEVIATIONS = TorchSDPA.KNOWN_DEVIATIONS + (CUDA_CUDNN_MASKED_BACKWARD_NAN,)

    @classmethod
    def supports(cls, facts):
        # H200, torch 2.11 (2026-11-27, commit 18ea361): "No available kernel" for every case with one key (498 sdpa
        # and 196 multi-head cases, forward and backward); no case with Lk 1 ran, 1,751 with Lk >= 2 did.
        if facts["Lk"] < 2:
            return "one key (Lk 1): torch's cuDNN backend refused every such case on an H200 (torch 2.11)"
        return None

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        # cuDNN takes a 2-D or 4-D attn_mask only ("Please use the following attn mask shapes: 2d ... 4d ...", 98
        # cases on an H200); a rank-3 mask (H|1, Lq, Lk) broadcasts as the same 4-D view (1, H|1, Lq, Lk).
        if mask is not None and mask.dim() == 3:
            mask = mask[None]
        return super().sdpa(q, k, v, mask=mask, is_causal=is_causal, scale=scale)


def _sink_factor(lse, sink):
    """Z / (Z + e^sigma) from the log-sum-exp lse = log Z and a learnable sink sigma: sigmoid(lse - sigma), each side
    written so that the value and its gradient keep float32's relative accuracy. sigmoid(lse - sigma) alone rounds to
    1 once the sink's weight P = sigmoid(sigma - lse) is below 2^-24, and its backward, y (1 - y) from that rounded y,
    gave dsink = 0 where the analytic one was -2.6e-16 (H200, torch_flex float32, allowed 7e-20). Where lse >= sigma
    this takes 1 - P, whose backward P (1 - P) keeps P's accuracy; a row without keys (lse = -inf) gives 0."""
    import torch

    return torch.where(lse >= sink, 1 - torch.sigmoid(sink - lse), torch.sigmoid(lse - sink))


class TorchFlexAttention:
    """torch.nn.attention.flex_attention compiled with torch.compile (its fused Triton kernel).

    The contract maps onto flex's modifications: a boolean mask and is_causal become a
    BlockMask (mask_mod), a float mask a score_mod adding it. Measured on an H100 (torch
    2.11+cu130): float32 needs head dims >= 16 ("NYI: embedding dimension ... at least
    16"); Dv != Dk, GQA (enable_gqa), scale <= 0 and fully masked rows (zeros) are right.
    CUDA only: on a CPU the compile goes through inductor's C++ backend, seconds per shape.
    """

    NAME = "torch_flex"
    ARRAY = "torch"
    DEVICES = ("cuda",)
    DTYPES = ("float32", "float16", "bfloat16")
    COMPILED = True
    # Head dims up to 128: at 256 (16-bit, 16 workers on an H100, torch 2.11+cu130, 2026-11-27) the forward's launch
    # failed with "CUDA driver error: out of memory" in Triton's static launcher (Lq = Lk = 65, 2 cases) and the
    # compiles of two backwards (softcap, learnable sink; Lq 65, Lk 64) ran past the 120 s call limit, after which 86
    # cases of that worker failed uncalled.
    SUPPORTS = {"head_dims": {"min": 16, "max": 128}}
    ALWAYS_LSE = False  # ask flex for the log-sum-exp only where a learnable sink needs it
    _compiled = None
    # H200, torch 2.11+cu130, 16 workers on 16 cores (2026-11-27): compiling the float32 kernel at Dk 256 (Lq = Lk =
    # 65) and at Dk 192 (Lq 1, Lk 256) was still in Triton's make_llir after 85 s and 120 s; in the next run one at
    # Dk 112, Dv 80 (both padded to 128 in the kernel) after 92 s, and float32 properties took 56-117 s a test
    # against 57-111 s for the 16-bit ones. Every float16 and bfloat16 compile returned.
    FLOAT32_MAX_HEAD_DIM = 64
    # Triton refusing a kernel whose tiles need more shared memory than the GPU has (H200, torch 2.11: the float16
    # backward at Dk 128, Dv 192 asked 246784 bytes of 232448): unsupported, as torch's "No available kernel" is.
    REFUSALS = ("out of resource",)

    @classmethod
    def supports(cls, facts):
        # On cuda only: the eager CPU subclass compiles no Triton kernel.
        if facts.get("device") == "cuda" and facts.get("dtype") == "float32" \
                and max(facts["Dk"], facts["Dv"]) > cls.FLOAT32_MAX_HEAD_DIM:
            return (f"float32 at head dims above {cls.FLOAT32_MAX_HEAD_DIM}: its Triton compile ran past 90 s on an "
                    "H200 (torch 2.11)")
        return None

    @classmethod
    def _flex(cls):
        if cls._compiled is None:
            import torch
            from torch.nn.attention.flex_attention import flex_attention

            # Every new input signature recompiles; past dynamo's default limit (8) flex would silently run
            # its unfused eager path, which is not the kernel under test.
            torch._dynamo.config.recompile_limit = 10**6
            torch._dynamo.config.accumulated_recompile_limit = 10**6
            cls._compiled = torch.compile(flex_attention)
        return cls._compiled

    @staticmethod
    def _mods(q, b, hq, lq, lk, *, is_causal, window, softcap, offset, sink_tokens, chunk, keep=None, bias=None,
              lengths=None, slopes=None, pads=None):
        """(mask_mod or None, score_mod or None): the contract's variants as flex's modifications, each present
        only where a case uses it."""
        import torch

        left, right = window if window is not None else (None, None)
        # softcap as a 0-d tensor the score_mod captures, not a Python float: once a second softcap value reaches
        # the compiled flex, dynamo passes the float as an unspecialized scalar, which inductor's flex lowering
        # cannot take (torch 2.11 on an H200 and 2.13 on a CPU: "LoweringException: RuntimeError:
        # unbacked_bindings" from the second value on; a captured tensor compiles once and is reused).
        cap = None if softcap is None else torch.tensor(float(softcap), dtype=torch.float32, device=q.device)
        mask_mod = score_mod = None
        if is_causal or keep is not None or window is not None or lengths is not None or chunk is not None \
                or pads is not None:
            def mask_mod(bi, h, qi, ki):
                # Positions count from the first real key (sdpa.key-leftpad): key ki at ki - pad, query qi at
                # offset + qi - pad.
                p, j = (qi + offset, ki) if pads is None else (qi + offset - pads[bi], ki - pads[bi])
                allowed = j <= p if is_causal else ki >= 0
                if left is not None:
                    within = j >= p - left
                    allowed = allowed & (within | ((j >= 0) & (j < sink_tokens)) if sink_tokens else within)
                if right is not None:
                    allowed = allowed & (j <= p + right)
                if chunk is not None:
                    allowed = allowed & (torch.div(j, chunk, rounding_mode="floor")
                                         == torch.div(p, chunk, rounding_mode="floor"))
                if pads is not None:
                    allowed = allowed & (j >= 0)
                if lengths is not None:
                    allowed = allowed & (ki < lengths[bi])
                return allowed & keep[bi, h, qi, ki] if keep is not None else allowed

        if softcap is not None or slopes is not None or bias is not None:
            def score_mod(score, bi, h, qi, ki):
                if cap is not None:
                    score = torch.tanh(score / cap) * cap
                if slopes is not None:
                    score = score - slopes[bi, h] * (qi + offset - ki).abs()
                if bias is not None:
                    score = score + bias[bi, h, qi, ki]
                return score
        return mask_mod, score_mod

    @staticmethod
    def _block_mask(mask_mod, b, h, lq, lk, device):
        """flex's BlockMask of ``mask_mod`` (the kernel skips the blocks it marks empty)."""
        from torch.nn.attention.flex_attention import create_block_mask

        return create_block_mask(mask_mod, b, h, lq, lk, device=device)

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None):
        # Every variant is flex's own: the causal band (offset), the window with its sink tokens, the chunk, key
        # lengths, the left padding and a boolean mask are one mask_mod (a BlockMask); softcap, ALiBi and a float
        # mask one score_mod, in the contract's order. The learnable sink, which is no key, rescales flex's output
        # by its log-sum-exp: o * Z / (Z + e^sigma) = o * sigmoid(lse - sigma) (a row without keys: lse = -inf, 0;
        # _sink_factor).
        import torch

        b, hq, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        options = {}
        if mask is not None and mask.dtype == torch.bool:
            options["keep"] = mask.expand(b, hq, lq, lk).contiguous()
        elif mask is not None:
            options["bias"] = mask.expand(b, hq, lq, lk).contiguous()
        if key_lengths is not None:
            options["lengths"] = key_lengths.to(device=q.device, dtype=torch.int64).reshape(-1).expand(b).contiguous()
        if alibi_slopes is not None:
            options["slopes"] = _slopes_4d(alibi_slopes, hq)[..., 0, 0].expand(b, hq).contiguous()
        if key_leftpad is not None:
            options["pads"] = key_leftpad.to(device=q.device, dtype=torch.int64).reshape(-1).expand(b).contiguous()
        mask_mod, score_mod = cls._mods(q, b, hq, lq, lk, is_causal=bool(is_causal), window=window, softcap=softcap,
                                        offset=int(query_offset), sink_tokens=int(sink_token_length),
                                        chunk=attention_chunk, **options)
        block_mask = None if mask_mod is None else cls._block_mask(mask_mod, b, hq, lq, lk, q.device)
        if learnable_sink is None and not cls.ALWAYS_LSE:
            return cls._flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                               enable_gqa=hq != k.shape[1])
        try:  # torch >= 2.9 asks for the log-sum-exp as an AuxRequest (return_lse is deprecated there)
            from torch.nn.attention.flex_attention import AuxRequest
        except ImportError:
            out, lse = cls._flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                   enable_gqa=hq != k.shape[1], return_lse=True)
        else:
            out, aux = cls._flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                   enable_gqa=hq != k.shape[1], return_aux=AuxRequest(lse=True))
            lse = aux.lse
        if learnable_sink is None:
            return out
        sink = _sink_4d(learnable_sink, hq)[..., 0].to(device=lse.device, dtype=lse.dtype)  # (1, Hq, 1)
        return (out * _sink_factor(lse, sink)[..., None].to(out.dtype)).to(q.dtype)


NEUTRAL_MASK_ELEMENTS = 2**22  # torch_flex_cpu: the largest neutral mask or bias it builds (4 M elements)


class TorchFlexAttentionCPU(TorchFlexAttention):
    """flex_attention on the CPU, eager (unfused): the framework path that expresses every variant on a CPU.

    Measured on the 2-core CI-like CPU (torch 2.13, benchmarks/variant_probe.py, machine shared): under
    torch.compile the first call of each new shape takes 15-45 s (inductor's C++ backend), then 16-31 ms; eager
    takes 0.8-1.2 s for its first call and 20-120 ms a call after (flex traces the mods on every call), against
    under 10 ms for torch_sdpa. So the CPU built-in runs eager, and is marked COMPILED: a per-call cost of a
    compile's order earns a compiling implementation's reduced example budget (a tenth; the full default
    budget took 9 min for this built-in alone in float32). It checks flex's semantics (the same
    mask_mod/score_mod as torch_flex), not its fused kernel. float32 only: each dtype adds every fixture again.
    GRADIENTS = False: flex has no backward on the CPU ("FlexAttention does not support backward on CPU",
    torch 2.13), so the gradient tests do not apply to it.
    """

    NAME = "torch_flex_cpu"
    DEVICES = ("cpu",)
    DTYPES = ("float32",)
    COMPILED = True
    GRADIENTS = False
    SUPPORTS = {}
    ALWAYS_LSE = True  # one structure of call for dynamo with and without a sink (_mods)

    @classmethod
    def _flex(cls):
        import warnings

        from torch.nn.attention.flex_attention import flex_attention

        import torch._dynamo
        import torch.fx.experimental._config as fx_config

        def eager(*args, **kwargs):
            # Eager flex still traces its call with dynamo (backend "eager"), once per new guard set. Shapes
            # dynamic from the first call, no 0/1 specialisation and no duck sizing (two sizes that happen to be
            # equal are not guarded equal): 104 -> 43 traces of 0.2 s in a default run, then 16 -> 4 over its sdpa
            # tests in one process (with ALWAYS_LSE), 8 with sdpa_varlen and sdpa_paged. The traced graph calls the
            # same aten ops on the same tensors, so what is judged does not change; the patches are scoped to this
            # call.
            with warnings.catch_warnings(), torch._dynamo.config.patch(assume_static_by_default=False), \
                    fx_config.patch(backed_size_oblivious=True, use_duck_shape=False):
                # "flex_attention called without torch.compile()": intended here (see the class docstring).
                warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
                return flex_attention(*args, **kwargs)

        return eager

    @staticmethod
    def _mods(q, b, hq, lq, lk, *, is_causal, window, softcap, offset, sink_tokens, chunk, keep=None, bias=None,
              lengths=None, slopes=None, pads=None):
        """The same modifications with one structure whatever the options: each option is a tensor, neutral where
        the case does not use it (a window edge beyond every distance, key lengths Lk, no padding, a bias of 0,
        ...). Dynamo traces eager flex once per structure of its call (the mods' closures' None-ness and Python
        values, a block mask or none, the log-sum-exp asked or not are guarded), so the options' 2^11 structures
        cost a trace each (0.2-1 s; 40-80 a default run); with this (and the log-sum-exp always asked for), one per
        {mask_mod, score_mod} present. A mod is left out where the case has nothing for it: its neutral mask or bias
        gathered at every score cost more than the two traces it saves (torch_flex_cpu's tests, one process: 31 s
        with both mods always, 16-18 s without). Exactly the same values: x + 0 and x - 0 * d are x, and a where()
        picks softcap's tanh only where it is asked for."""
        import torch

        device, whole = q.device, dict(dtype=torch.int64, device=q.device)
        uses_mask = is_causal or keep is not None or window is not None or lengths is not None or chunk is not None \
            or pads is not None
        uses_scores = softcap is not None or slopes is not None or bias is not None
        if b * hq * lq * lk > NEUTRAL_MASK_ELEMENTS:  # no neutral (B, H, Lq, Lk) mask or bias for a large shape
            return TorchFlexAttention._mods(q, b, hq, lq, lk, is_causal=is_causal, window=window, softcap=softcap,
                                            offset=offset, sink_tokens=sink_tokens, chunk=chunk, keep=keep,
                                            bias=bias, lengths=lengths, slopes=slopes, pads=pads)
        beyond = lq + lk + abs(offset) + 1  # farther than any query from any key
        left, right = (window if window is not None else (None, None))
        left = torch.tensor(beyond if left is None else int(left), **whole)
        right = torch.tensor(beyond if right is None else int(right), **whole)
        causal = torch.tensor(bool(is_causal), device=device)
        chunked = torch.tensor(chunk is not None, device=device)
        chunk = torch.tensor(1 if chunk is None else int(chunk), **whole)
        offset = torch.tensor(int(offset), **whole)
        sink_tokens = torch.tensor(int(sink_tokens), **whole)
        pads = torch.zeros(b, **whole) if pads is None else pads
        lengths = torch.full((b,), lk, **whole) if lengths is None else lengths
        # Contiguous like a given mask (an expanded one has other strides, which dynamo guards too).
        keep = torch.ones((b, hq, lq, lk), dtype=torch.bool, device=device) if keep is None and uses_mask else keep
        capped = torch.tensor(softcap is not None, device=device)
        cap = torch.tensor(1.0 if softcap is None else float(softcap), dtype=q.dtype, device=device)
        slopes = torch.zeros((b, hq), dtype=q.dtype, device=device) if slopes is None else slopes
        bias = torch.zeros((b, hq, lq, lk), dtype=q.dtype, device=device) if bias is None and uses_scores else bias

        def mask_mod(bi, h, qi, ki):
            p, j = qi + offset - pads[bi], ki - pads[bi]
            allowed = (j <= p) | ~causal
            allowed = allowed & ((j >= p - left) | ((j >= 0) & (j < sink_tokens)))
            allowed = allowed & (j <= p + right)
            same_chunk = torch.div(j, chunk, rounding_mode="floor") == torch.div(p, chunk, rounding_mode="floor")
            allowed = allowed & (same_chunk | ~chunked)
            return allowed & (j >= 0) & (ki < lengths[bi]) & keep[bi, h, qi, ki]

        def score_mod(score, bi, h, qi, ki):
            score = torch.where(capped, torch.tanh(score / cap) * cap, score)
            score = score - slopes[bi, h] * (qi + offset - ki).abs()
            return score + bias[bi, h, qi, ki]

        return (mask_mod if uses_mask else None), (score_mod if uses_scores else None)

    @staticmethod
    def _block_mask(mask_mod, b, h, lq, lk, device, block: int = 128):
        """Every block partial: flex's dense CPU path (torch/_higher_order_ops/flex_attention.py math_attention)
        reads only the BlockMask's mask_mod, applied to every score, so the result is the same as with
        create_block_mask's (checked bit for bit), whose vmapped mask_mod over every score cost 10-80 ms a call."""
        import torch
        from torch.nn.attention.flex_attention import BlockMask

        nq, nk, h = -(-lq // block), -(-lk // block), h or 1
        counts = torch.full((b, h, nq), nk, dtype=torch.int32, device=device)
        indices = torch.arange(nk, dtype=torch.int32, device=device).expand(b, h, nq, nk).contiguous()
        return BlockMask.from_kv_blocks(counts, indices, BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(lq, lk))

    @classmethod
    def sdpa(cls, q, k, v, *args, **kwargs):
        # Refused up front (GRADIENTS = False keeps the suite from asking): flex raises its own error only after
        # a whole forward.
        if any(t.requires_grad for t in (q, k, v)):
            raise NotImplementedError("flex_attention has no backward on the CPU (torch 2.13)")
        return super().sdpa(q, k, v, *args, **kwargs)

    # Packed and paged batches (issue 25), in flex's own idioms: document masking for sdpa_varlen (a mask_mod keeping
    # a key only for a query of the same sequence, on per-row sequence ids and positions), and torch's PagedAttention
    # for sdpa_paged (torch/nn/attention/experimental/_paged_attention.py: a logical BlockMask converted to the
    # physical pages of the cache, whose mask_mod and score_mod map each physical key back to its logical position
    # and mask the slots past seqused_k). Each has one structure of mods whatever the options (every option a tensor,
    # neutral where unused), as _mods above, so eager flex traces it once.
    @staticmethod
    def _sequence_mods(device, dtype, is_causal, window, softcap):
        """The band, window and softcap of a sequence's positions as tensors (neutral where unused)."""
        import torch

        whole = dict(dtype=torch.int64, device=device)
        beyond = 1 << 30
        left, right = window if window is not None else (None, None)
        return dict(causal=torch.tensor(bool(is_causal), device=device),
                    left=torch.tensor(beyond if left is None else int(left), **whole),
                    right=torch.tensor(beyond if right is None else int(right), **whole),
                    capped=torch.tensor(softcap is not None, device=device),
                    cap=torch.tensor(1.0 if softcap is None else float(softcap), dtype=dtype, device=device))

    @staticmethod
    def _keep(o, p, j):
        """Whether query position p keeps key position j (tensors), by the band and the window in ``o``."""
        return ((j <= p) | ~o["causal"]) & (j >= p - o["left"]) & (j <= p + o["right"])

    @staticmethod
    def _capped(o, score):
        import torch

        return torch.where(o["capped"], torch.tanh(score / o["cap"]) * o["cap"], score)

    @classmethod
    def _with_sink(cls, q, k, v, block_mask, score_mod, scale, learnable_sink, hq: int):
        """flex's output, rescaled by its log-sum-exp for a learnable sink as the sdpa path does."""
        import torch

        kwargs = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=hq != k.shape[1])
        if learnable_sink is None and not cls.ALWAYS_LSE:
            return cls._flex()(q, k, v, **kwargs)
        from torch.nn.attention.flex_attention import AuxRequest

        out, aux = cls._flex()(q, k, v, return_aux=AuxRequest(lse=True), **kwargs)
        if learnable_sink is None:
            return out
        sink = _sink_4d(learnable_sink, hq)[..., 0].to(device=aux.lse.device, dtype=aux.lse.dtype)
        return (out * _sink_factor(aux.lse, sink)[..., None].to(out.dtype)).to(q.dtype)

    @classmethod
    def sdpa_varlen(cls, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                    scale=None, *, seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
        import torch

        device, hq = q.device, q.shape[1]
        rows = [torch.as_tensor(x, device=device) for x in _packed_positions(cu_seqlens_q, cu_seqlens_k, seqused_k)]
        query_seq, query_position, key_seq, key_position, used = rows
        slopes = torch.as_tensor(_per_row_slopes(alibi_slopes, rows[0].cpu().numpy(), hq), dtype=q.dtype,
                                 device=device)  # (Hq, total_q)
        o = cls._sequence_mods(device, q.dtype, is_causal, window, softcap)

        def document(bi, h, qi, ki):  # a key counts for a query of its own sequence only
            return (query_seq[qi] == key_seq[ki]) & used[ki] & cls._keep(o, query_position[qi], key_position[ki])

        def score_mod(score, bi, h, qi, ki):
            return cls._capped(o, score) - slopes[h, qi] * (query_position[qi] - key_position[ki]).abs()

        total_q, total_k = q.shape[0], k.shape[0]
        block_mask = cls._block_mask(document, 1, None, total_q, total_k, device)
        # (1, H, total, D), contiguous: a transposed view's strides change with the total, each a new dynamo trace.
        heads_first = [x.transpose(0, 1)[None].contiguous() for x in (q, k, v)]
        out = cls._with_sink(*heads_first, block_mask, score_mod, scale, learnable_sink, hq)
        return out[0].transpose(0, 1).contiguous()

    @classmethod
    def sdpa_paged(cls, q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
                   softcap=None, alibi_slopes=None, learnable_sink=None):
        import torch
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask

        device, (b, hq, lq, _), (pages, block, hkv, _) = q.device, q.shape, k_cache.shape
        table, used = _host_ints(block_table), _host_ints(seqused_k).reshape(-1)
        paged = PagedAttention(pages, block, b, device=str(device))
        for row in range(b):  # each sequence's used pages: physical page -> its logical block
            n = -(-int(used[row]) // block)
            paged.page_table[row, :n] = torch.as_tensor(table[row, :n], device=device)
            paged.physical_to_logical[row, torch.as_tensor(table[row, :n], device=device)] = torch.arange(n)
        lengths = torch.as_tensor(used, device=device)
        offset = lengths - lq  # bottom-right: query row i at i + seqused_k[b] - Lq
        slopes = torch.zeros((b, hq), dtype=q.dtype, device=device) if alibi_slopes is None \
            else _slopes_4d(alibi_slopes, hq)[..., 0, 0].to(q.dtype).expand(b, hq)
        o = cls._sequence_mods(device, q.dtype, is_causal, window, softcap)

        def logical(bi, h, qi, ki):
            return cls._keep(o, qi + offset[bi], ki)

        def score_mod(score, bi, h, qi, ki):
            return cls._capped(o, score) - slopes[bi, h] * (qi + offset[bi] - ki).abs()

        logical_mask = create_block_mask(logical, b, None, lq, table.shape[1] * block, device=device,
                                         BLOCK_SIZE=(128, block))
        block_mask = paged.convert_logical_block_mask(logical_mask, kv_len=lengths)
        physical = [cache.permute(2, 0, 1, 3).reshape(1, hkv, pages * block, cache.shape[3])
                    for cache in (k_cache, v_cache)]
        return cls._with_sink(q, *physical, block_mask, paged.get_score_mod(score_mod, kv_len=lengths), scale,
                              learnable_sink, hq)


class TorchMultiheadAttentionModule:
    """torch.nn.MultiheadAttention, its conventions translated to the contract.

    The module stores weights as (out, in) (transposed here), packs q/k/v into
    in_proj_weight when kdim == vdim == E (separate q/k/v_proj_weight otherwise),
    has one bias switch for all projections (absent biases become zeros), and its
    boolean attn_mask means "masked out" (inverted here). It supports only
    H * Dk == H * Dv == E (head width E / H) and an output width E; other
    parameter shapes raise NotImplementedError (unsupported, not failed).
    """

    NAME = "torch_nn_mha"
    ARRAY = "torch"
    DTYPES = ALL_DTYPES
    SUPPORTS = {"mha_head_width": "e_over_h"}  # said, so that generated cases are drawn inside

    @staticmethod
    def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
        import torch

        e, e_kv = query.shape[-1], key.shape[-1]
        w_q, w_k, w_v, w_o = (params[n] for n in ("w_q", "w_k", "w_v", "w_o"))
        if not (w_q.shape[1] == w_k.shape[1] == w_v.shape[1] == e == w_o.shape[0] == w_o.shape[1]):
            raise NotImplementedError("nn.MultiheadAttention needs H*Dk == H*Dv == E and an output width E")
        if key.shape[-1] != value.shape[-1] and e_kv != e:
            raise NotImplementedError("nn.MultiheadAttention needs kdim == vdim here")
        module = torch.nn.MultiheadAttention(
            e, num_heads, bias=True, kdim=e_kv, vdim=e_kv, batch_first=True, dtype=query.dtype, device=query.device
        )

        def bias(name, width):
            b = params.get("b_" + name)
            return torch.zeros(width, dtype=query.dtype, device=query.device) if b is None else b

        with torch.no_grad():
            if module._qkv_same_embed_dim:
                module.in_proj_weight.copy_(torch.cat([w_q.T, w_k.T, w_v.T]))
            else:
                module.q_proj_weight.copy_(w_q.T)
                module.k_proj_weight.copy_(w_k.T)
                module.v_proj_weight.copy_(w_v.T)
            module.in_proj_bias.copy_(torch.cat([bias("q", e), bias("k", e), bias("v", e)]))
            module.out_proj.weight.copy_(w_o.T)
            module.out_proj.bias.copy_(bias("o", e))
        b, lq, lk = query.shape[0], query.shape[1], key.shape[1]
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=query.device)
        if is_causal:
            allowed = allowed.tril()
        if mask is None or mask.dtype == torch.bool:
            keep = allowed if mask is None else allowed & mask
            # nn.MultiheadAttention: True means "not allowed to attend".
            attn_mask = ~keep.expand(b, num_heads, lq, lk).reshape(b * num_heads, lq, lk)
        else:
            bias_ = mask.masked_fill(~allowed, float("-inf"))
            attn_mask = bias_.expand(b, num_heads, lq, lk).reshape(b * num_heads, lq, lk)
        out, _ = module(query, key, value, attn_mask=attn_mask, need_weights=False)
        return out


def _bounded_window(window, lq: int, lk: int):
    """jax.nn.dot_product_attention's local_window_size for a window: an unbounded side (None) becomes a size
    beyond every distance between a query and a key."""
    return None if window is None else tuple(lq + lk if side is None else int(side) for side in window)


# Errors by which a GPU compiler refuses a program (a refusal to compile, not a wrong result; declared as REFUSALS, so
# that a case meeting one, in its call or its gradients, is unsupported with the compiler's reason), measured:
# XLA:GPU refuses the F16_F16_F32 dot that jax.nn.dot_product_attention asks for in some float16 shapes (H100, jax
# 0.11.2: forward at Lq = Lk = 1, every head dim; H200, the same jax: the backward at Lq 3, Lk 7, Dk 1); other float16
# shapes run.
XLA_GPU_DOT_REFUSAL = "Unsupported dot precision algorithm"
# Triton refuses a Pallas kernel whose tiles need more shared memory than the GPU has (H200, jax 0.11.2, Pallas flash
# in float32 at Dk 128 with more than one key block: 262144 bytes asked, 232448 available).
TRITON_SHARED_MEMORY_REFUSAL = "Shared memory size limit exceeded"


class JaxDotProductAttention:
    """jax.nn.dot_product_attention.

    A row fully masked by a boolean mask averages v (JAX masks with a large finite
    negative, not -inf); a row whose float bias is all -inf is NaN (0/0). Both are
    declared, measured on jax 0.10.2, and reported as deviations.

    Dtypes on CPU, measured on jax 0.10.2: float64 inputs are computed at float32
    precision (the XLA path asks dot_general for float32 results; errors around 1e-8
    against the float64 oracle); float16 raises "The precision 'F16_F16_F32' is not
    supported by dot_general on CPU"; bfloat16 raises "Algorithm not supported by the
    ElementalIrEmitter: ALG_DOT_BF16_BF16_F32" for some small shapes. So only float32
    is declared on CPU.
    """

    NAME = "jax_dpa"
    ARRAY = "jax"
    DTYPES = {"cpu": ("float32",), "cuda": ("float32", "float16", "bfloat16")}
    # What sdpa below refuses (Dv != Dk; a query offset: the API has none), declared so that no case is drawn
    # only to be refused (about 100 unsupported cases a default run before).
    SUPPORTS = {"value_head_dim": "same", "variants": ["window", "alibi_slopes", "query_lengths", "key_lengths"]}
    # JAX's default matmul precision on NVIDIA GPUs rounds float32 matmul inputs to TF32 (H100, jax 0.11.2:
    # error 9.2e-4 at the default precision, 3.7e-7 at "highest"); this built-in judges JAX as users run it.
    FLOAT32_MATMUL = {"cuda": "tf32"}
    # Measured on jax 0.10.2 CPU: JAX folds the boolean mask, is_causal, the window and the key lengths into one
    # mask filled with -0.7 * finfo.max, so a row any of them empties averages v, also beside a float bias (the
    # older {"bool": "uniform", "float": "nan"} had said NaN for key-length rows of a case with a float mask); a
    # bias -inf on every key is NaN, and one -inf on every key those removals leave attends the removed keys.
    KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note="jax 0.10.2, measured on CPU"),)
    FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS
    REFUSALS = (XLA_GPU_DOT_REFUSAL,)

    @classmethod
    def supports(cls, facts):
        # H200, jax 0.11.2 (2026-11-27, commit 18ea361): XLA:GPU refused the float16 dot (XLA_GPU_DOT_REFUSAL) for
        # 131 of the 131 float16 cases with one key, sdpa and multi-head, and ran none; 15 other float16 refusals
        # (backward programs, Lk 5-65) follow no rule seen and stay unsupported at the call.
        if facts.get("device") == "cuda" and facts.get("dtype") == "float16" and facts["Lk"] < 2:
            return "float16 with one key (Lk 1) on cuda: XLA:GPU refused its dot in every such case (H200, jax 0.11.2)"
        return None

    @staticmethod
    def softmax(x, axis=-1):
        return _softmax_in_buckets(JaxDotProductAttention._softmax, x, axis)

    @staticmethod
    def _softmax(x, axis=-1):
        import jax

        return jax.nn.softmax(x, axis=axis)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, alibi_slopes=None, query_offset=0,
             query_lengths=None, key_lengths=None):
        # No softcap (the API has none). Measured on jax 0.10.2 CPU (benchmarks/variant_probe.py): local_window_size
        # (l, r) allows i - l <= j <= i + r, both edges inclusive, aligned at query 0 (also when Lq != Lk, also with
        # is_causal), as the contract's window with query_offset 0; key_value_seq_lengths masks keys j >= length (a
        # row left with none averages v, as a fully masked boolean row does); query_seq_lengths zeroes the padding
        # rows. JAX has no query offset, so query_offset > 0 is refused. ALiBi travels as the API's bias.
        if k.shape[-1] != v.shape[-1]:
            raise NotImplementedError("jax.nn.dot_product_attention requires Dv == Dk")
        if query_offset:
            raise NotImplementedError("jax.nn.dot_product_attention has no query offset: is_causal and "
                                      "local_window_size are aligned at query 0")
        variants = _used(window=_bounded_window(window, q.shape[2], k.shape[2]), alibi_slopes=alibi_slopes,
                         query_lengths=query_lengths, key_lengths=key_lengths)
        # One program per structure: is_causal and the window static; the scale (a traced scalar; None stays
        # static), the mask and the variants' arrays traced.
        static = ("is_causal", "window") if variants else ("is_causal",)
        options = dict(variants, is_causal=is_causal, scale=None if scale is None else np.float64(scale))
        if _differentiated_eagerly(q, k, v, mask) and not _traced(alibi_slopes, query_lengths, key_lengths):
            return JaxDotProductAttention._sdpa_vjp(q, k, v, mask, static, options)
        return _jitted(JaxDotProductAttention._sdpa, *static)(q, k, v, mask, **options)

    @staticmethod
    def _sdpa_vjp(q, k, v, mask, static: tuple, options: dict):
        """sdpa under an eager jax.vjp (the gradient tests): a custom_vjp whose forward is the forward tests' own
        program and whose backward is jax.vjp of the same body, one jitted program (forward recomputed, then the
        backward), as a jitted training step runs it. The plain eager vjp compiled a forward with its residuals and
        a backward per case. Differentiated: q, k, v and a float mask; a boolean mask is a constant."""
        import jax

        boolean = mask if mask is not None and np.dtype(mask.dtype) == np.bool_ else None
        forward = _jitted(JaxDotProductAttention._sdpa, *static)
        backward = _jitted(JaxDotProductAttention._sdpa_backward, *static)

        @jax.custom_vjp
        def attend(q, k, v, bias):
            return forward(q, k, v, boolean if bias is None else bias, **options)

        def forward_rule(q, k, v, bias):
            return attend(q, k, v, bias), (q, k, v, bias)

        def backward_rule(saved, d_out):
            q, k, v, bias = saved
            return tuple(backward(q, k, v, boolean if bias is None else bias, d_out, **options)) + (
                (None,) if bias is None else ())

        attend.defvjp(forward_rule, backward_rule)
        return attend(q, k, v, None if boolean is not None else mask)

    @staticmethod
    def _sdpa_backward(q, k, v, mask, d_out, **options):
        """(dq, dk, dv), and dmask for a float mask: the vjp of _sdpa at (q, k, v, mask) for upstream d_out."""
        import jax

        def attend(q, k, v, m=mask):
            return JaxDotProductAttention._sdpa(q, k, v, m, **options)

        primals = (q, k, v) if mask is None or mask.dtype == bool else (q, k, v, mask)  # a boolean mask: a constant
        return jax.vjp(attend, *primals)[1](d_out)

    @staticmethod
    def _sdpa(q, k, v, mask=None, is_causal=False, scale=None, window=None, alibi_slopes=None, query_lengths=None,
              key_lengths=None):
        import jax
        import jax.numpy as jnp

        if k.shape[-1] != v.shape[-1]:
            raise NotImplementedError("jax.nn.dot_product_attention requires Dv == Dk")
        if scale is not None:
            scale = jnp.asarray(scale, q.dtype)
        bias = boolean = None
        if mask is not None:
            mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape)
            if mask.dtype == jnp.bool_:
                boolean = mask
            else:
                bias = mask
        if alibi_slopes is not None:
            lq, lk = q.shape[2], k.shape[2]
            distance = jnp.abs(jnp.arange(lq)[:, None] - jnp.arange(lk)[None, :]).astype(alibi_slopes.dtype)
            alibi = (-_slopes_4d(alibi_slopes, q.shape[1]) * distance).astype(q.dtype)
            bias = alibi if bias is None else alibi + bias
        out = jax.nn.dot_product_attention(
            jnp.swapaxes(q, 1, 2),  # the API's layout is (B, L, H, D)
            jnp.swapaxes(k, 1, 2),
            jnp.swapaxes(v, 1, 2),
            bias=bias,
            mask=boolean,
            scale=scale,
            is_causal=is_causal,
            query_seq_lengths=query_lengths,
            key_value_seq_lengths=key_lengths,
            local_window_size=window,
        )
        return jnp.swapaxes(out, 1, 2)

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             alibi_slopes=None, query_lengths=None, key_lengths=None):
        # The variants its sdpa takes, converted as there (an unbounded window side beyond every distance).
        window = _bounded_window(window, query.shape[1], key.shape[1])
        return _jax_mha(JaxDotProductAttention._sdpa, query, key, value, params, num_heads, mask, is_causal,
                        **_used(window=window, alibi_slopes=alibi_slopes, query_lengths=query_lengths,
                                key_lengths=key_lengths))


class JaxNumpy:
    """Hand-written jax.numpy in the input dtype.

    On the CPU it declares float64 and float32 only: every dtype is a new XLA compile for every fixture and
    generated shape (0.2-0.3 s each on the 2-core CI machine, where the cache starts cold), and its float16
    and bfloat16 items took 123 s of CI's 880 s of worker time, more than any other built-in in all its
    dtypes. The 16-bit model is exercised on the CPU by numpy_native, torch_math, torch_sdpa and
    torch_nn_mha; on CUDA, where JAX's 16-bit paths are used, jax_numpy runs all four dtypes.
    """

    NAME = "jax_numpy"
    ARRAY = "jax"
    DTYPES = {"cpu": ("float64", "float32"), "cuda": ALL_DTYPES}

    @staticmethod
    def softmax(x, axis=-1):
        return _softmax_in_buckets(JaxNumpy._softmax, x, axis)

    @staticmethod
    def _softmax(x, axis=-1):
        import jax.numpy as jnp

        shifted = x - jnp.max(x, axis=axis, keepdims=True)
        e = jnp.exp(shifted)
        return e / jnp.sum(e, axis=axis, keepdims=True)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None):
        # query_lengths only marks padding rows, which the contract does not judge: every row is computed.
        variants = dict(window=window, softcap=softcap, alibi_slopes=alibi_slopes, query_offset=query_offset,
                        key_lengths=key_lengths, sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                        key_leftpad=key_leftpad)
        if not _traced(q, k, v, mask, learnable_sink):  # concrete arrays: one program per bucket
            return JaxNumpy._sdpa_in_buckets(q, k, v, mask, is_causal, scale, learnable_sink=learnable_sink,
                                             **variants)
        if not _traced(alibi_slopes, key_lengths, key_leftpad) and _differentiated_eagerly(q, k, v, mask,
                                                                                          learnable_sink):
            return JaxNumpy._sdpa_vjp_in_buckets(q, k, v, mask, is_causal, scale, learnable_sink, **variants)
        if window is None and softcap is None and alibi_slopes is None and not query_offset and key_lengths is None \
                and learnable_sink is None and attention_chunk is None and key_leftpad is None:
            return _jax_sdpa(JaxNumpy._sdpa, q, k, v, mask, is_causal, scale)
        # Structure is static (one compile per window/softcap/offset/chunk/sink-token count), arrays are traced.
        return _jitted(JaxNumpy._sdpa, "is_causal", "window", "softcap", "query_offset", "sink_token_length",
                       "attention_chunk")(
            q, k, v, mask, is_causal=is_causal, scale=None if scale is None else np.float64(scale),
            window=None if window is None else tuple(window), softcap=softcap, alibi_slopes=alibi_slopes,
            query_offset=int(query_offset), key_lengths=key_lengths, learnable_sink=learnable_sink,
            sink_token_length=int(sink_token_length),
            attention_chunk=None if attention_chunk is None else int(attention_chunk), key_leftpad=key_leftpad)

    @staticmethod
    def _sdpa_in_buckets(q, k, v, mask, is_causal, scale, **variants):
        """sdpa as one jitted program per bucket of sizes (a kernel's padding to its block; _Buckets): neither a new
        length, head count, window, softcap, offset or mask shape compiles. XLA compiles over jax_numpy's tests in one
        process: 440 -> 110 sdpa compiles with lengths and head dims padded; with batch and heads padded and
        multi_head_attention on the same buckets, all of jax_numpy's 232 -> 121; with the gradients in the buckets
        (_sdpa_vjp_in_buckets) 90; with (batch entry, kv head) pairs as one axis and head dims from 64, 74."""
        import jax

        bucket = _Buckets(q, k, v, mask, is_causal, scale, **variants)
        out = _jitted(JaxNumpy._sdpa_uniform)(*bucket.padded, **bucket.options)
        return jax.device_put(bucket.output(out))

    @staticmethod
    def _sdpa_vjp_in_buckets(q, k, v, mask, is_causal, scale, learnable_sink, **variants):
        """sdpa under an eager jax.vjp (the gradient tests): a custom_vjp whose forward and backward run on the
        concrete values in the buckets of _sdpa_in_buckets, the backward one jitted vjp of _sdpa_uniform per bucket
        (its gradients at the padding are cut off, as its outputs are: padded queries get a zero upstream gradient,
        padded keys a zero weight). The traced path compiled a forward and a backward program per case shape (48
        compiles over jax_numpy's gradient tests in one process); the forward now shares the forward tests' buckets.
        Differentiated: q, k, v, a float mask, the learnable sink; every other argument is a constant."""
        import jax

        boolean = mask if mask is not None and np.dtype(mask.dtype) == np.bool_ else None
        bucket = {}  # the forward's layout, which the backward reuses

        @jax.custom_vjp
        def attend(q, k, v, bias, sink):  # only its vjp runs (forward, backward); this is the rule's primal
            return JaxNumpy._sdpa(q, k, v, boolean if bias is None else bias, is_causal, scale,
                                  learnable_sink=sink, **variants)

        def forward(q, k, v, bias, sink):
            where = bucket["layout"] = _Buckets(q, k, v, boolean if bias is None else bias, is_causal, scale,
                                                learnable_sink=sink, **variants)
            out = _jitted(JaxNumpy._sdpa_uniform)(*where.padded, **where.options)
            return jax.device_put(where.output(out)), (bias, sink)

        def backward(saved, d_out):
            where = bucket["layout"]
            grads = _jitted(JaxNumpy._uniform_vjp)(*where.padded, where.padded_output(d_out), **where.options)
            return where.gradients(grads, *saved)

        attend.defvjp(forward, backward)
        return attend(q, k, v, None if boolean is not None else mask, learnable_sink)

    @staticmethod
    def _uniform_vjp(q, k, v, d_out, **options):
        """The vjp of _sdpa_uniform at a bucket: (dq, dk, dv, dbias, dsink) for upstream d_out."""
        import jax

        def attend(q, k, v, bias, sink):
            return JaxNumpy._sdpa_uniform(q, k, v, **dict(options, bias=bias, sink=sink))

        return jax.vjp(attend, q, k, v, options["bias"], options["sink"])[1](d_out)

    @staticmethod
    def _uniform_options(xp, q, k, mask, is_causal, scale, *, window=None, softcap=None, alibi_slopes=None,
                         query_offset=0, key_lengths=None, learnable_sink=None, sink_token_length=0,
                         attention_chunk=None, key_leftpad=None) -> dict:
        """_sdpa_uniform's arguments after q, k, v by name, arrays of ``xp`` (NumPy on the host, jax.numpy under a
        trace), each neutral where its option is unused: keep (bool) of (B, Hq, Lq, Lk), the keys each row attends
        (_attended_keys: the boolean mask and every variant that removes keys), the float mask as bias of that
        shape, ALiBi slopes and sink logits of (B, Hq)."""
        (b, hq, lq, dk), lk = q.shape, k.shape[2]
        floats = np.float64 if q.dtype == np.float64 else np.float32  # the slopes' and sinks' dtype (the contract)
        keep, bias = None, xp.zeros((b, hq, lq, lk), dtype=q.dtype)
        if mask is not None:
            mask = xp.broadcast_to(mask, (b, hq, lq, lk))
            keep, bias = (mask, bias) if mask.dtype == np.bool_ else (None, mask)
        keep = JaxNumpy._attended_keys(xp, (b, hq, lq, lk), keep, is_causal, window, query_offset, key_lengths,
                                       sink_token_length, attention_chunk, key_leftpad)
        return dict(
            keep=keep, bias=bias, scale=xp.asarray(1.0 / math.sqrt(dk) if scale is None else scale),
            capped=xp.asarray(softcap is not None), cap=xp.asarray(1.0 if softcap is None else softcap),
            slopes=xp.zeros((b, hq), floats) if alibi_slopes is None
            else xp.broadcast_to(xp.asarray(alibi_slopes).astype(floats), (b, hq)),
            offset=xp.asarray(query_offset, dtype=np.int32), has_sink=xp.asarray(learnable_sink is not None),
            sink=xp.zeros((b, hq), floats) if learnable_sink is None
            else xp.broadcast_to(_sink_4d(xp.asarray(learnable_sink), hq).reshape(1, hq).astype(floats), (b, hq)))

    @staticmethod
    def _attended_keys(xp, shape, keep, is_causal, window, query_offset, key_lengths, sink_token_length,
                       attention_chunk, key_leftpad):
        """(B, Hq, Lq, Lk) bool: the keys each query row attends, from the boolean mask ``keep`` (or None) and the
        variants that remove keys (is_causal, the window with its sink tokens, the chunk, the key lengths and left
        pads), by the contract's position rule (oracle.positions_allowed). For concrete arrays (``xp`` NumPy) on the
        host, the lengths and pads read off the device (_positions_allowed), so the program gets one mask (a
        kernel's mask from the host): that structure compiled into every bucket's program was a third of the
        compile time. Under a trace (``xp`` jax.numpy: the lengths and pads may be tracers) the same rule in
        jax.numpy."""
        options = dict(sink_token_length=sink_token_length, attention_chunk=attention_chunk, key_leftpad=key_leftpad)
        if xp is np:
            allowed = _positions_allowed(shape[2], shape[3], is_causal, window, query_offset, key_lengths, **options)
        else:
            from attention_conformance.conformance import oracle

            allowed = oracle.positions_allowed(shape[2], shape[3], is_causal, window, query_offset, key_lengths,
                                               xp=xp, **options)
        return xp.broadcast_to(allowed if keep is None else allowed & keep, shape)

    @staticmethod
    def _sdpa_uniform(q, k, v, keep, bias, scale, capped, cap, slopes, offset, has_sink, sink):
        """_sdpa with every option an array (_sdpa_in_buckets): each step as there, a neutral value where unused
        (x + 0, x - 0 * d, a where() that picks the plain step); ``keep`` the attended keys (_attended_keys)."""
        import jax.numpy as jnp

        group = _head_groups(q, k)
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
        lq, lk = q.shape[-2], k.shape[-2]
        # precision HIGHEST: float32 matmuls at float32 precision on GPUs too (JAX's default there is TF32). q scaled
        # first (as torch_math): in float16 q @ k^T of an outlier channel overflowed to inf where the scaled score fits
        # (H100, jax 0.11.2: every output NaN, sdpa.score-range).
        scores = jnp.einsum("bhqd,bhkd->bhqk", q * scale.astype(q.dtype), k, precision="highest")
        scores = jnp.where(capped, jnp.tanh(scores / cap.astype(q.dtype)) * cap.astype(q.dtype), scores)
        distance = (offset + jnp.arange(lq))[:, None] - jnp.arange(lk)[None, :]
        scores = scores - (slopes[:, :, None, None] * jnp.abs(distance).astype(slopes.dtype)).astype(scores.dtype)
        scores = jnp.where(keep, scores + bias, -jnp.inf)
        # No sink is a logit of -inf (an exp of 0, its gradient 0), not an unselected exp that could overflow: that
        # made NaN gradients under where().
        sink = jnp.where(has_sink, sink[:, :, None, None].astype(scores.dtype), -jnp.inf)
        weights = JaxNumpy._softmax_with_sink(scores, sink)
        return jnp.einsum("bhqk,bhkd->bhqd", weights.astype(q.dtype), v, precision="highest")

    @staticmethod
    def _softmax_with_sink(scores, sink):
        """The weights of the keys of ``scores`` (-inf: removed) under a softmax whose maximum and normaliser also
        take the sink logit ``sink`` (one per row, broadcast; -inf: none); a row without keys or sink gives 0.

        The sink is one more column of the logits (spec/tolerances.yaml, variants: a key of value 0): XLA compiles a
        forward bucket of sdpa in 0.10-0.16 s on the 2-core CPU where the sink's maximum and exp kept apart took
        0.26-0.46 s (float32; 0.14-0.20 against 0.17-0.29 s in float64); its vjp compiles as before."""
        import jax.numpy as jnp

        logits = jnp.concatenate([scores, jnp.broadcast_to(sink, scores.shape[:-1] + (1,))], axis=-1)
        top = jnp.max(logits, axis=-1, keepdims=True)
        e = jnp.exp(logits - jnp.where(jnp.isfinite(top), top, 0))
        total = jnp.sum(e, axis=-1, keepdims=True)
        return (e / jnp.where(total > 0, total, 1))[..., :-1]

    @staticmethod
    def _sdpa(q, k, v, mask=None, is_causal=False, scale=None, window=None, softcap=None, alibi_slopes=None,
              query_offset=0, key_lengths=None, learnable_sink=None, sink_token_length=0, attention_chunk=None,
              key_leftpad=None):
        """The traced body (gradients, multi_head_attention; inside their jit, structure static): _sdpa_uniform
        unpadded, its options jax arrays."""
        import jax.numpy as jnp

        options = JaxNumpy._uniform_options(
            jnp, q, k, mask, is_causal, scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
            query_offset=query_offset, key_lengths=key_lengths, learnable_sink=learnable_sink,
            sink_token_length=sink_token_length, attention_chunk=attention_chunk, key_leftpad=key_leftpad)
        return JaxNumpy._sdpa_uniform(q, k, v, **options)

    @staticmethod
    def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False, *, window=None,
                             softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
                             learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None):
        import jax

        # query_lengths only marks padding rows, which the contract does not judge: every row is computed.
        variants = _used(window=None if window is None else tuple(window), softcap=softcap,
                         alibi_slopes=alibi_slopes, query_offset=int(query_offset), key_lengths=key_lengths,
                         learnable_sink=learnable_sink, sink_token_length=int(sink_token_length),
                         attention_chunk=None if attention_chunk is None else int(attention_chunk),
                         key_leftpad=key_leftpad)
        if not _traced(query, key, value, mask, *params.values()):
            return JaxNumpy._mha_in_buckets(query, key, value, params, num_heads, mask, is_causal, **variants)
        # The projections too: "highest" makes every float32 matmul of the traced program full precision.
        with jax.default_matmul_precision("highest"):
            return _jax_mha(JaxNumpy._sdpa, query, key, value, params, num_heads, mask, is_causal, **variants)

    @staticmethod
    def _mha_in_buckets(query, key, value, params, num_heads, mask, is_causal, **variants):
        """multi_head_attention on concrete arrays from bucketed programs, as sdpa: each projection one jitted
        matmul per bucket (_project_in_buckets), the heads split and merged on the host, the heads' attention
        _sdpa_in_buckets (whose buckets the sdpa tests share). Over its tests in one process: 76 XLA compiles (one
        per distinct shape of the whole pipeline) -> 8 projection programs, the attention in sdpa's buckets."""
        import jax

        params = {name: np.asarray(array) for name, array in params.items()}

        def project(x, name):
            return JaxNumpy._project_in_buckets(np.asarray(x), params["w_" + name], params.get("b_" + name))

        q, k, v = (_split_heads(project(x, name), num_heads, np) for x, name in ((query, "q"), (key, "k"),
                                                                                (value, "v")))
        context = np.asarray(JaxNumpy._sdpa_in_buckets(q, k, v, mask, is_causal, None, **variants))
        return jax.device_put(project(_merge_heads(context, np), "o"))

    @staticmethod
    def _project_in_buckets(x: np.ndarray, weight: np.ndarray, bias) -> np.ndarray:
        """x @ weight + bias in x's dtype, one jitted program per bucket: the rows (every leading axis) padded to a
        power of two (at least 32), both widths likewise; the padding is zeros, which add nothing to a dot product,
        and is cut off on the host."""
        rows = x.reshape(-1, x.shape[-1])
        (n, e), f = rows.shape, weight.shape[1]
        n2, e2, f2 = _bucket(n, 32), _bucket(e, 32), _bucket(f, 32)
        bias = np.zeros(f2, weight.dtype) if bias is None else _padded(np.asarray(bias), (f2,))
        out = _jitted(JaxNumpy._affine)(_padded(rows, (n2, e2)), _padded(weight, (e2, f2)), bias)
        return np.asarray(out)[:n, :f].reshape(x.shape[:-1] + (f,))

    @staticmethod
    def _affine(x, weight, bias):
        import jax.numpy as jnp

        # precision HIGHEST: float32 matmuls at float32 precision on GPUs too (JAX's default there is TF32).
        return jnp.matmul(x, weight, precision="highest") + bias

    # Packed and paged batches (issue 25): one jitted program each, whatever the variants (every option an array,
    # neutral where unused), fed arrays padded on the host to bucket sizes (_bucket; head dims to a multiple of 8,
    # zeros that change no dot product): a new packed length, cache size or head dim costs no compile within its
    # bucket. The sequences' structure (offsets, used lengths, the alignment) is read on the host into a keep mask
    # and the ALiBi distances; the pages are gathered in the program through the block table.
    @staticmethod
    def _options(q, scale, softcap, learnable_sink, hq: int):
        dk = q.shape[-1]
        sink = np.full(hq, -np.inf) if learnable_sink is None else _host_floats(learnable_sink)
        return dict(scale=np.float64(1.0 / math.sqrt(dk) if scale is None else scale), sink=sink,
                    cap=np.float64(1.0 if softcap is None else softcap), capped=np.bool_(softcap is not None))

    @staticmethod
    def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                    seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
        import jax

        qh, kh, vh = np.asarray(q), np.asarray(k), np.asarray(v)
        (rows, hq, dk), (cols, hkv, dv) = qh.shape, vh.shape
        query_seq, query_position, key_seq, key_position, used = _packed_positions(cu_seqlens_q, cu_seqlens_k,
                                                                                    seqused_k)
        keep = (query_seq[:, None] == key_seq[None, :]) & used[None, :] \
            & _sequence_keep(query_position[:, None], key_position[None, :], is_causal, window)
        distance = np.abs(query_position[:, None] - key_position[None, :]).astype(np.float64)
        # Rows, keys, heads and head dims padded to buckets (one program per bucket); padded keys are not kept,
        # padded rows and query heads cut off.
        r, c, dk2, dv2, heads = _bucket(rows, 32), _bucket(cols, 32), _bucket(dk, 8), _bucket(dv, 8), \
            _HeadBucket(hq, hkv)
        options = JaxNumpy._options(qh, scale, softcap, learnable_sink, hq)
        options["sink"] = heads.query(options["sink"], 0, -np.inf)
        out = _jitted(JaxNumpy._packed)(
            _padded(heads.query(qh, 1), (r, heads.hkv2 * heads.group2, dk2)),
            _padded(kh, (c, heads.hkv2, dk2)), _padded(vh, (c, heads.hkv2, dv2)),
            _padded(keep, (r, c), False), _padded(distance, (r, c)),
            _padded(heads.query(_per_row_slopes(alibi_slopes, query_seq, hq), 0), (heads.hkv2 * heads.group2, r)),
            **options)
        # device_put: jnp.asarray of a NumPy array compiles a program (lax.stage) per shape
        return jax.device_put(np.ascontiguousarray(heads.real(np.asarray(out)[:rows, :, :dv], 1)))

    @staticmethod
    def _packed(q, k, v, keep, distance, slopes, sink, scale, cap, capped):
        """q (R, Hq, Dk), k (C, Hkv, Dk), v (C, Hkv, Dv), keep and distance (R, C), slopes (Hq, R), sink (Hq,)."""
        import jax.numpy as jnp

        group = q.shape[1] // k.shape[1]
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
        scores = jnp.einsum("qhd,khd->hqk", q * scale.astype(q.dtype), k, precision="highest")
        return jnp.einsum("hqk,khd->qhd", JaxNumpy._sequence_weights(
            scores, keep[None], (slopes[:, :, None] * distance[None]), sink[:, None, None], cap, capped, q.dtype),
            v, precision="highest")

    @staticmethod
    def _sequence_weights(scores, keep, bias, sink, cap, capped, dtype):
        """softcap (where ``capped``), the ALiBi ``bias`` subtracted, the removed keys -inf, then the softmax with the
        sink logit (-inf: none) in its maximum and normaliser; a row without keys gives 0."""
        import jax.numpy as jnp

        cap = cap.astype(scores.dtype)
        scores = jnp.where(capped, jnp.tanh(scores / cap) * cap, scores)
        scores = jnp.where(keep, scores - bias.astype(scores.dtype), -jnp.inf)
        return JaxNumpy._softmax_with_sink(scores, sink.astype(scores.dtype)).astype(dtype)

    @staticmethod
    def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None, *, window=None,
                   softcap=None, alibi_slopes=None, learnable_sink=None):
        import jax

        qh, kc, vc = np.asarray(q), np.asarray(k_cache), np.asarray(v_cache)
        table = _host_ints(block_table).astype(np.int32)
        (b, hq, lq, dk), (pages, block, hkv, dv) = qh.shape, vc.shape
        keys = table.shape[1] * block
        keep = _paged_mask(seqused_k, lq, keys, is_causal, window, None, hq)[:, 0]
        used = _host_ints(seqused_k).reshape(-1, 1, 1)
        distance = np.abs(np.arange(lq).reshape(1, lq, 1) + (used - lq) - np.arange(keys).reshape(1, 1, keys))
        slopes = np.zeros((b, hq)) if alibi_slopes is None else np.broadcast_to(_host_floats(alibi_slopes), (b, hq))
        # Batch, rows, pages, table width, page size, heads and head dims padded to buckets (one program per bucket):
        # each page's padded slots and the table's padded entries are keys not kept, padded rows and heads cut off.
        bb, ll, pp, mb = _bucket(b, 4), _bucket(lq, 8), _bucket(pages, 8), _bucket(table.shape[1], 4)
        block2, dk2, dv2, heads = _bucket(block, 4), _bucket(dk, 8), _bucket(dv, 8), _HeadBucket(hq, hkv)

        def per_slot(x, fill):  # (B, Lq, blocks * block) -> (bb, ll, mb * block2): each page's slots padded
            x = _padded(x.reshape(b, lq, table.shape[1], block), (bb, ll, mb, block2), fill)
            return x.reshape(bb, ll, mb * block2)

        options = JaxNumpy._options(qh, scale, softcap, learnable_sink, hq)
        options["sink"] = heads.query(options["sink"], 0, -np.inf)
        out = _jitted(JaxNumpy._paged)(
            _padded(heads.query(qh, 1), (bb, heads.hkv2 * heads.group2, ll, dk2)),
            _padded(kc, (pp, block2, heads.hkv2, dk2)), _padded(vc, (pp, block2, heads.hkv2, dv2)),
            _padded(table, (bb, mb)), per_slot(keep, False), per_slot(distance.astype(np.float64), 0),
            _padded(heads.query(np.asarray(slopes), 1), (bb, heads.hkv2 * heads.group2)), **options)
        # device_put: jnp.asarray of a NumPy array compiles a program (lax.stage) per shape
        return jax.device_put(np.ascontiguousarray(heads.real(np.asarray(out)[:b, :, :lq, :dv], 1)))

    @staticmethod
    def _paged(q, k_cache, v_cache, table, keep, distance, slopes, sink, scale, cap, capped):
        """q (B, Hq, Lq, Dk), caches (pages, block, Hkv, D), table (B, max_blocks), keep and distance (B, Lq, keys)."""
        import jax.numpy as jnp

        b, blocks = table.shape

        def gathered(cache):  # (B, Hkv, blocks * block, D): each sequence's pages in table order
            pages = jnp.take(cache, table.reshape(-1), axis=0)
            return jnp.swapaxes(pages.reshape(b, blocks * cache.shape[1], *cache.shape[2:]), 1, 2)

        group = q.shape[1] // k_cache.shape[2]
        k, v = jnp.repeat(gathered(k_cache), group, axis=1), jnp.repeat(gathered(v_cache), group, axis=1)
        scores = jnp.einsum("bhqd,bhkd->bhqk", q * scale.astype(q.dtype), k, precision="highest")
        weights = JaxNumpy._sequence_weights(scores, keep[:, None], slopes[:, :, None, None] * distance[:, None],
                                             sink[None, :, None, None], cap, capped, q.dtype)
        return jnp.einsum("bhqk,bhkd->bhqd", weights, v, precision="highest")


class JaxCuDNNAttention:
    """jax.nn.dot_product_attention(implementation="cudnn"): cuDNN's fused attention.

    Measured on an H100 (jax 0.11.2): float16/bfloat16 only ("Q must be fp16/bf16/fp8"),
    Dv == Dk, head dims 8..256 a multiple of 8; a mask must span (Lq, Lk) ("Bias must
    have same seq length as QKV"), so the adapter broadcasts it; the scale must be a
    Python float (a traced one raises UnexpectedTracerError), so each scale compiles.
    """

    NAME = "jax_dpa_cudnn"
    ARRAY = "jax"
    DEVICES = ("cuda",)
    DTYPES = {"cuda": ("float16", "bfloat16")}
    SUPPORTS = {"head_dims": {"min": 8, "max": 256, "multiple": 8}, "value_head_dim": "same"}
    KNOWN_DEVIATIONS = CUDA_16BIT_KERNEL_DEVIATIONS

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        scale = None if scale is None else float(scale)
        return _jitted(JaxCuDNNAttention._sdpa, "is_causal", "scale")(q, k, v, mask, is_causal=is_causal, scale=scale)

    @staticmethod
    def _sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        import jax
        import jax.numpy as jnp

        bias = boolean = None
        if mask is not None:
            mask = jnp.reshape(mask, (1,) * (4 - mask.ndim) + mask.shape)
            mask = jnp.broadcast_to(mask, mask.shape[:2] + (q.shape[2], k.shape[2]))
            if mask.dtype == jnp.bool_:
                boolean = mask
            else:
                bias = mask.astype(q.dtype)
        out = jax.nn.dot_product_attention(
            jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2),
            bias=bias, mask=boolean, scale=scale, is_causal=is_causal, implementation="cudnn",
        )
        return jnp.swapaxes(out, 1, 2)


class JaxPallasFlashAttention:
    """The Pallas (Triton) flash attention kernel, jax.experimental.pallas.ops.gpu.attention.mha.

    Measured on an H100 (jax 0.11.2): sequence lengths must be multiples of its block
    (128) and array sizes powers of 2; it takes no mask; it assumes as many kv heads as
    query heads (given fewer, its output is silently wrong, errors 0.9), so the adapter
    repeats kv heads for GQA; its causal path fails under jax_enable_x64 (int32/int64
    in lax.div), so the adapter traces it with x64 off.

    Measured on an H200 (jax 0.11.2, 2026-11-27), with kernel-shaped cases: float32 runs its
    dots in TF32 (errors 1.1e-4 to 1.5e-4, 1.4x to 2.3x the float32 allowance, at Dk 64 and 128;
    Pallas's Triton lowering gives a dot of no precision TF32 inputs), declared; the causal key
    loop runs to the query block's diagonal, past the last key when Lq > Lk (Lq 256, Lk 128:
    1.6e8 in bfloat16, 0.15 off in float16), so causal cases need Lq <= Lk; float32 at Dk 128
    with more than one key block asks Triton for more shared memory than the GPU has (a
    refusal: unsupported); the fused backward refuses lengths split into different numbers of
    blocks (unsupported).
    """

    NAME = "jax_pallas_flash"
    ARRAY = "jax"
    DEVICES = ("cuda",)
    DTYPES = {"cuda": ("float32", "float16", "bfloat16")}
    SUPPORTS = {"head_dims": [16, 32, 64, 128], "value_head_dim": "same", "lengths": {"multiple": 128, "max": 2048},
                "masks": ["none"], "causal": "lq<=lk"}
    FLOAT32_MATMUL = {"cuda": "tf32"}
    REFUSALS = (TRITON_SHARED_MEMORY_REFUSAL,)
    BACKWARD_BLOCK = 32  # BlockSizes.get_default()'s block_q_dq and block_kv_dkv, the fused backward's blocks

    @staticmethod
    def sdpa(q, k, v, is_causal=False, scale=None):
        lq, lk = q.shape[2], k.shape[2]
        block = JaxPallasFlashAttention.BACKWARD_BLOCK
        if _differentiated_eagerly(q, k, v) and lq // min(block, lq) != lk // min(block, lk):
            # mha's own check, made before the forward runs: it raises ValueError when the pullback is traced.
            raise NotImplementedError("Pallas flash's fused backward: q_seq_len and kv_seq_len must be divided "
                                      f"into the same number of blocks (Lq {lq}, Lk {lk}, blocks of {block})")
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        with _x64_off():
            # The scale is static: mha passes it to a custom_vjp as a non-differentiable argument.
            return _jitted(JaxPallasFlashAttention._sdpa, "is_causal", "scale")(q, k, v, is_causal=is_causal,
                                                                                scale=scale)

    @staticmethod
    def _sdpa(q, k, v, is_causal=False, scale=1.0):
        import jax.numpy as jnp
        from jax.experimental.pallas.ops.gpu import attention

        group = _head_groups(q, k)
        k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
        out = attention.mha(jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), None,
                            sm_scale=scale, causal=is_causal)
        return jnp.swapaxes(out, 1, 2)


# ------------------------------------------------------------------ FP8 attention (issue 25)
@functools.cache
def _scaled_mm_on_cpu() -> bool:
    """Whether this torch's FP8 GEMM runs on the CPU (torch 2.13 does; older builds raise)."""
    import torch

    one = torch.ones((1, 1)).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(one, one, scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0), out_dtype=torch.float32)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


class TorchScaledMMFP8:
    """FP8 attention from torch's FP8 ops, arranged as FlashAttention 3 arranges its forward: per (batch, head),
    S = torch._scaled_mm(q, k^T) of the float8 inputs with q_descale, k_descale as its scales (float32 out; q's
    factor is its kv head's), then the scale, a softcap, the masks, the row maximum m, P = 2^8 e^(s - m) in float32,
    the row sum from that P, P cast to the inputs' float8 format (torch's own rounding), O = torch._scaled_mm(P, v)
    with v_descale as v's scale, O / row sum, bfloat16 out (FP8_OUTPUT_DTYPE). torch._scaled_mm runs on the CPU in
    torch 2.13 (any shape, e4m3fn and e5m2); on CUDA it needs sm89+ and dims in multiples of 16, not measured here:
    CPU only.
    """

    NAME = "torch_scaled_mm_fp8"
    ARRAY = "torch"
    DTYPES = ("float8_e4m3fn", "float8_e5m2")
    DEVICES = ("cpu",)
    FP8_OUTPUT_DTYPE = "bfloat16"
    MAX_OFFSET = 8  # FlashAttention 3's: P in [0, 256] uses more of the 8-bit range than [0, 1]

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, query_offset=0,
             query_lengths=None, key_lengths=None, q_descale=None, k_descale=None, v_descale=None):
        # query_lengths only marks padding rows, which the contract does not judge: every row is computed.
        import torch

        if not _scaled_mm_on_cpu():
            raise NotImplementedError(f"torch {torch.__version__}: torch._scaled_mm does not run on the CPU")
        b, hq, lq, _ = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        group = hq // hkv
        one = torch.ones((b, hkv), dtype=torch.float32)
        qd, kd, vd = (one if d is None else d.to(torch.float32) for d in (q_descale, k_descale, v_descale))
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        keep = torch.from_numpy(_positions_allowed(lq, lk, is_causal, window, query_offset, key_lengths))
        if mask is not None and mask.dtype == torch.bool:
            keep = keep & mask
        out = torch.zeros((b, hq, lq, v.shape[-1]), dtype=torch.float32)
        for i in range(b):
            for h in range(hq):
                g = h // group
                s = torch._scaled_mm(q[i, h], k[i, g].t(), scale_a=qd[i, g], scale_b=kd[i, g],
                                     out_dtype=torch.float32) * scale
                if softcap is not None:
                    s = torch.tanh(s / softcap) * softcap
                if mask is not None and mask.dtype != torch.bool:
                    s = s + torch.broadcast_to(mask, (b, hq, lq, lk))[i, h]
                s = s.masked_fill(~torch.broadcast_to(keep, (b, hq, lq, lk))[i, h], float("-inf"))
                top = s.amax(dim=-1, keepdim=True)
                top = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
                p = torch.exp(s - top) * 2.0**cls.MAX_OFFSET
                total = p.sum(dim=-1, keepdim=True)
                o = torch._scaled_mm(p.to(v.dtype), v[i, g], scale_a=torch.tensor(1.0), scale_b=vd[i, g],
                                     out_dtype=torch.float32)
                out[i, h] = torch.where(total > 0, o / torch.where(total > 0, total, 1.0), 0.0)
        return out.to(torch.bfloat16)


def _x64_off():
    """A context in which JAX traces with jax_enable_x64 off (its name moved between JAX releases)."""
    import jax

    for owner, name in ((jax, "enable_x64"), (getattr(jax, "experimental", None), "disable_x64")):
        fn = getattr(owner, name, None)
        if fn is not None:
            return fn(False) if name == "enable_x64" else fn()
    raise NotImplementedError("this JAX has no context manager to trace with x64 off")


BUILTINS = (
    NumpyOracle,
    NumpyNative,
    TorchMath,
    TorchSDPA,
    TorchFlashAttention,
    TorchMemoryEfficientAttention,
    TorchCuDNNAttention,
    TorchFlexAttention,
    TorchFlexAttentionCPU,
    TorchMultiheadAttentionModule,
    JaxDotProductAttention,
    JaxCuDNNAttention,
    JaxPallasFlashAttention,
    JaxNumpy,
    TorchScaledMMFP8,
)

"""What the JAX built-ins share: bucket sizes and padding, the jitted programs (cached, CPU programs compiled with XLA's
elemental emitters where they give the same bits), whether arrays are traced, and x64 switched off around a call.
"""
from __future__ import annotations

import functools

import numpy as np

from attention_conformance.implementations.builtin.common import mha_with

# jax_numpy's sdpa buckets (_Buckets): a case whose padded entries, heads and lengths hold at most this many scores is
# padded further, to at least 4 (batch entry, kv head) pairs and 4 query heads per kv head.
SMALL_BUCKET_SCORES = 2**16


def bucket_size(n: int, least: int) -> int:
    """The bucket a size is padded to for a compiling path: the next power of two, at least ``least``, so that XLA
    compiles once per bucket, not once per packed length or cache size (what serving stacks do for CUDA graphs)."""
    return max(least, 1 << max(int(n) - 1, 0).bit_length())


def pad_to(array: np.ndarray, shape: tuple[int, ...], fill=0) -> np.ndarray:
    """``array`` in the leading corner of an array of ``shape`` filled with ``fill``."""
    out = np.full(shape, fill, dtype=array.dtype)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out


class HeadBucket:
    """Query heads (Hkv kv heads of ``group`` query heads each) padded to a bucket of Hkv2 kv heads of group2 query
    heads, each power of two at least 4 (sdpa_varlen and sdpa_paged of jax_numpy; _Buckets does the same for sdpa):
    one program for every head layout of a small case. A padded kv head holds zeros, a padded query head is cut."""

    def __init__(self, hq: int, hkv: int):
        if hq % hkv:
            raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
        self.hkv, self.group = hkv, hq // hkv
        self.hkv2, self.group2 = bucket_size(hkv, 4), bucket_size(self.group, 4)

    def query(self, x: np.ndarray, axis: int, fill=0) -> np.ndarray:
        """x with its Hq axis ``axis`` padded to Hkv2 * group2, query head h of kv head h // group kept in place."""
        x = np.moveaxis(np.asarray(x), axis, 0)
        grouped = x.reshape((self.hkv, self.group) + x.shape[1:])
        padded = pad_to(grouped, (self.hkv2, self.group2) + x.shape[1:], fill)
        return np.moveaxis(padded.reshape((self.hkv2 * self.group2,) + x.shape[1:]), 0, axis)

    def real(self, x: np.ndarray, axis: int) -> np.ndarray:
        """The real Hq heads of a padded Hkv2 * group2 axis ``axis``."""
        x = np.moveaxis(np.asarray(x), axis, 0)
        x = x.reshape((self.hkv2, self.group2) + x.shape[1:])[:self.hkv, :self.group]
        return np.moveaxis(x.reshape((self.hkv * self.group,) + x.shape[2:]), 0, axis)



JITTED: dict = {}


def softmax_in_buckets(body, x, axis: int):
    """``body`` (a softmax over ``axis``) jitted, as one program per bucket of sizes for concrete arrays (as
    jax_numpy's _sdpa_in_buckets): the axis moved last and the rest flattened to rows on the host, the rows padded
    to a power of two (at least 32) and cut off after, the axis padded likewise with -inf, which adds exp(-inf) = 0
    to every sum (jax_numpy: 51 -> 11 XLA compiles over its tests in one process with buckets from 8; 12 -> 8 with
    buckets from 32). Traced or empty arrays take the plain jitted body."""
    if traced(x) or not np.size(x):
        return jitted(body, "axis")(x, axis=axis)
    import jax

    moved = np.moveaxis(np.asarray(x), axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    padded = pad_to(rows, (bucket_size(rows.shape[0], 32), bucket_size(rows.shape[1], 32)), -np.inf)
    padded[rows.shape[0]:] = 0  # whole padding rows: finite, never read
    out = np.asarray(jitted(body, "axis")(padded, axis=-1))[:rows.shape[0], :rows.shape[1]]
    return jax.device_put(np.ascontiguousarray(np.moveaxis(out.reshape(moved.shape), -1, axis)))


def jitted(fn, *static: str):
    """jax.jit of ``fn`` with the named arguments static, built once (on the CPU with CPU_COMPILER_OPTIONS).

    XLA compiles once per distinct shape/dtype signature (about 0.1 s on a 2-core
    CPU); op-by-op dispatch would compile every primitive separately for each new
    shape, several times slower. Only structure is static (is_causal, an axis, the
    head count): a scale is traced, so a new scale value does not recompile.
    """
    if (fn, static) not in JITTED:  # the same body jitted with more static arguments is another program
        JITTED[(fn, static)] = Jitted(fn, static_argnames=static)
    return JITTED[(fn, static)]


# The built-ins' XLA:CPU programs are compiled with the elemental emitters instead of the MLIR fusion emitters
# (XLA's default): the same HLO, the same bits, 40 % less compile time. Measured on jax 0.10.2 with a fixed
# Hypothesis seed: all 2,184 results of the JAX built-ins' calls in a default run (forward, gradients, multi-head,
# softmax, float64) bit for bit those of the default emitters; the 60 distinct jax_dpa programs of a run compiled
# in 2.43 s against 4.06 s. A cold default run compiles about 230 such programs (docs/speed.md). Only the
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


class Jitted:
    """A body jitted twice at most: with cpu_compiler_options() for arguments that live on the CPU, plain for
    others (a GPU's, or a trace's, whose enclosing program is compiled by its own options)."""

    def __init__(self, fn, **jit_options):
        self.fn, self.jit_options, self.by_platform = fn, jit_options, {}

    def __call__(self, *args, **kwargs):
        cpu = on_cpu(args)
        if cpu not in self.by_platform:
            import jax

            options = cpu_compiler_options() if cpu else None
            self.by_platform[cpu] = jax.jit(self.fn, **self.jit_options, compiler_options=options)
        return self.by_platform[cpu](*args, **kwargs)


def on_cpu(args) -> bool:
    """Whether the program these arguments start compiles for the CPU: their first JAX array lives there (not a
    tracer), or, of host arrays only, JAX's default backend is the CPU."""
    import jax

    for leaf in jax.tree_util.tree_leaves(args):
        if isinstance(leaf, jax.core.Tracer):
            return False
        if isinstance(leaf, jax.Array):
            return all(device.platform == "cpu" for device in leaf.devices())
    return jax.default_backend() == "cpu"


def traced(*arrays) -> bool:
    """Whether any of the arrays is a JAX tracer (inside jax.vjp or jit): its values are not on the host."""
    import jax

    return any(isinstance(a, jax.core.Tracer) for a in arrays if a is not None)


def jax_sdpa(body, q, k, v, mask, is_causal, scale):
    """Call a jitted sdpa body: the scale travels as a traced scalar (None stays static)."""
    if scale is not None:
        scale = np.float64(scale)  # each body rounds it to q's dtype, as a Python float would be
    return jitted(body, "is_causal")(q, k, v, mask, is_causal=is_causal, scale=scale)


# Variant keywords that are structure (a compile each), not arrays: static in a jitted body.
JAX_STATIC_VARIANTS = ("window", "softcap", "query_offset", "sink_token_length", "attention_chunk")


def jax_mha(sdpa_body, query, key, value, params, num_heads, mask, is_causal, **variants):
    """Multi-head attention around an sdpa body, the whole pipeline one jitted XLA program. ``variants``: keywords
    of the body (mha.variants), those of JAX_STATIC_VARIANTS static (hashable), the others traced arrays."""
    if ("mha", sdpa_body) not in JITTED:
        import jax.numpy as jnp

        def mha(query, key, value, params, mask, arrays, num_heads, is_causal, static):
            def sdpa(q, k, v, mask=None, is_causal=False, **extra):
                return sdpa_body(q, k, v, mask, is_causal=is_causal, scale=None, **extra)

            return mha_with(sdpa, query, key, value, params, num_heads, mask, is_causal, jnp, **arrays,
                             **dict(static))

        JITTED[("mha", sdpa_body)] = Jitted(mha, static_argnames=("num_heads", "is_causal", "static"))
    static = tuple(sorted((n, v) for n, v in variants.items() if n in JAX_STATIC_VARIANTS))
    arrays = {n: v for n, v in variants.items() if n not in JAX_STATIC_VARIANTS}
    return JITTED[("mha", sdpa_body)](query, key, value, params, mask, arrays, num_heads=num_heads,
                                       is_causal=is_causal, static=static)


def x64_off():
    """A context in which JAX traces with jax_enable_x64 off (its name moved between JAX releases)."""
    import jax

    for owner, name in ((jax, "enable_x64"), (getattr(jax, "experimental", None), "disable_x64")):
        fn = getattr(owner, name, None)
        if fn is not None:
            return fn(False) if name == "enable_x64" else fn()
    raise NotImplementedError("this JAX has no context manager to trace with x64 off")

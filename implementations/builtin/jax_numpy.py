"""jax_numpy: attention written in jax.numpy, run as one jitted program per bucket of padded sizes (a kernel's
padding to its block), so that neither a new shape nor a new variant value compiles again.
"""
from __future__ import annotations

import math

import numpy as np

from attention_conformance.implementations.builtin import jax_jit
from attention_conformance.implementations.builtin.common import (
    ALL_DTYPES,
    used_variants,
    differentiated_eagerly,
    head_groups,
    host_floats,
    host_ints,
    merge_heads,
    merge_states_with,
    packed_positions,
    paged_mask,
    per_row_slopes,
    positions_allowed,
    sequence_keep,
    sink_4d,
    split_heads,
)
from attention_conformance.implementations.builtin.jax_jit import (
    SMALL_BUCKET_SCORES,
    HeadBucket,
    bucket_size,
    jax_mha,
    jax_sdpa,
    pad_to,
    softmax_in_buckets,
)


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
        return softmax_in_buckets(JaxNumpy._softmax, x, axis)

    @staticmethod
    def merge_states(out, lse, *, learnable_sink=None):
        """FlashInfer's merge in jax.numpy (common.merge_states_with), jitted once per shape."""
        return jax_jit.jitted(JaxNumpy._merge_states)(out, lse, learnable_sink)

    @staticmethod
    def _merge_states(out, lse, learnable_sink):
        import jax.numpy as jnp

        return merge_states_with(jnp, out, lse, learnable_sink)

    @staticmethod
    def _softmax(x, axis=-1):
        import jax.numpy as jnp

        shifted = x - jnp.max(x, axis=axis, keepdims=True)
        e = jnp.exp(shifted)
        return e / jnp.sum(e, axis=axis, keepdims=True)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
             query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None, sink_token_length=0,
             attention_chunk=None, key_leftpad=None, return_lse=False):
        # query_lengths only marks padding rows, which the contract does not judge: every row is computed.
        variants = dict(window=window, softcap=softcap, alibi_slopes=alibi_slopes, query_offset=query_offset,
                        key_lengths=key_lengths, sink_token_length=sink_token_length, attention_chunk=attention_chunk,
                        key_leftpad=key_leftpad)
        if return_lse:  # the forward of concrete arrays (the lse's programs share the buckets of the output's)
            if jax_jit.traced(q, k, v, mask, learnable_sink, alibi_slopes, key_lengths, key_leftpad):
                raise NotImplementedError("jax_numpy returns the log-sum-exp of concrete arrays only, not under a trace")
            return JaxNumpy._sdpa_in_buckets(q, k, v, mask, is_causal, scale, learnable_sink=learnable_sink,
                                             return_lse=True, **variants)
        if not jax_jit.traced(q, k, v, mask, learnable_sink):  # concrete arrays: one program per bucket
            return JaxNumpy._sdpa_in_buckets(q, k, v, mask, is_causal, scale, learnable_sink=learnable_sink,
                                             **variants)
        if not jax_jit.traced(alibi_slopes, key_lengths, key_leftpad) and differentiated_eagerly(q, k, v, mask,
                                                                                          learnable_sink):
            return JaxNumpy._sdpa_vjp_in_buckets(q, k, v, mask, is_causal, scale, learnable_sink, **variants)
        if window is None and softcap is None and alibi_slopes is None and not query_offset and key_lengths is None \
                and learnable_sink is None and attention_chunk is None and key_leftpad is None:
            return jax_sdpa(JaxNumpy._sdpa, q, k, v, mask, is_causal, scale)
        # Structure is static (one compile per window/softcap/offset/chunk/sink-token count), arrays are traced.
        return jax_jit.jitted(JaxNumpy._sdpa, "is_causal", "window", "softcap", "query_offset", "sink_token_length",
                       "attention_chunk")(
            q, k, v, mask, is_causal=is_causal, scale=None if scale is None else np.float64(scale),
            window=None if window is None else tuple(window), softcap=softcap, alibi_slopes=alibi_slopes,
            query_offset=int(query_offset), key_lengths=key_lengths, learnable_sink=learnable_sink,
            sink_token_length=int(sink_token_length),
            attention_chunk=None if attention_chunk is None else int(attention_chunk), key_leftpad=key_leftpad)

    @staticmethod
    def _sdpa_in_buckets(q, k, v, mask, is_causal, scale, return_lse=False, **variants):
        """sdpa as one jitted program per bucket of sizes (a kernel's padding to its block; _Buckets): neither a new
        length, head count, window, softcap, offset or mask shape compiles. XLA compiles over jax_numpy's tests in one
        process: 440 -> 110 sdpa compiles with lengths and head dims padded; with batch and heads padded and
        multi_head_attention on the same buckets, all of jax_numpy's 232 -> 121; with the gradients in the buckets
        (_sdpa_vjp_in_buckets) 90; with (batch entry, kv head) pairs as one axis and head dims from 64, 74."""
        import jax

        bucket = _Buckets(q, k, v, mask, is_causal, scale, **variants)
        if return_lse:
            out, lse = jax_jit.jitted(JaxNumpy._sdpa_uniform_lse)(*bucket.padded, **bucket.options)
            return jax.device_put(bucket.output(out)), jax.device_put(bucket.row_values(lse))
        out = jax_jit.jitted(JaxNumpy._sdpa_uniform)(*bucket.padded, **bucket.options)
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
            out = jax_jit.jitted(JaxNumpy._sdpa_uniform)(*where.padded, **where.options)
            return jax.device_put(where.output(out)), (bias, sink)

        def backward(saved, d_out):
            where = bucket["layout"]
            grads = jax_jit.jitted(JaxNumpy._uniform_vjp)(*where.padded, where.padded_output(d_out), **where.options)
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
            else xp.broadcast_to(sink_4d(xp.asarray(learnable_sink), hq).reshape(1, hq).astype(floats), (b, hq)))

    @staticmethod
    def _attended_keys(xp, shape, keep, is_causal, window, query_offset, key_lengths, sink_token_length,
                       attention_chunk, key_leftpad):
        """(B, Hq, Lq, Lk) bool: the keys each query row attends, from the boolean mask ``keep`` (or None) and the
        variants that remove keys (is_causal, the window with its sink tokens, the chunk, the key lengths and left
        pads), by the contract's position rule (oracle.positions_allowed). For concrete arrays (``xp`` NumPy) on the
        host, the lengths and pads read off the device (positions_allowed), so the program gets one mask (a
        kernel's mask from the host): that structure compiled into every bucket's program was a third of the
        compile time. Under a trace (``xp`` jax.numpy: the lengths and pads may be tracers) the same rule in
        jax.numpy."""
        options = dict(sink_token_length=sink_token_length, attention_chunk=attention_chunk, key_leftpad=key_leftpad)
        if xp is np:
            allowed = positions_allowed(shape[2], shape[3], is_causal, window, query_offset, key_lengths, **options)
        else:
            from attention_conformance.conformance.reference import oracle

            allowed = oracle.positions_allowed(shape[2], shape[3], is_causal, window, query_offset, key_lengths,
                                               xp=xp, **options)
        return xp.broadcast_to(allowed if keep is None else allowed & keep, shape)

    @staticmethod
    def _sdpa_uniform(q, k, v, keep, bias, scale, capped, cap, slopes, offset, has_sink, sink):
        """_sdpa with every option an array (_sdpa_in_buckets): each step as there, a neutral value where unused
        (x + 0, x - 0 * d, a where() that picks the plain step); ``keep`` the attended keys (_attended_keys)."""
        import jax.numpy as jnp

        scores, sink, v = JaxNumpy._uniform_scores(q, k, v, keep, bias, scale, capped, cap, slopes, offset, has_sink,
                                                   sink)
        weights = JaxNumpy._softmax_with_sink(scores, sink)
        return jnp.einsum("bhqk,bhkd->bhqd", weights.astype(q.dtype), v, precision="highest")

    @staticmethod
    def _sdpa_uniform_lse(q, k, v, keep, bias, scale, capped, cap, slopes, offset, has_sink, sink):
        """(_sdpa_uniform's output, each row's log-sum-exp in float32): the lse of the logits the softmax saw, the
        sink's among them; -inf for a row without keys or sink."""
        import jax.numpy as jnp

        scores, sink, v = JaxNumpy._uniform_scores(q, k, v, keep, bias, scale, capped, cap, slopes, offset, has_sink,
                                                   sink)
        weights = JaxNumpy._softmax_with_sink(scores, sink)
        logits = jnp.concatenate([scores, jnp.broadcast_to(sink, scores.shape[:-1] + (1,))], axis=-1)
        logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
        top = jnp.max(logits, axis=-1)
        shift = jnp.where(jnp.isfinite(top), top, 0)
        lse = shift + jnp.log(jnp.sum(jnp.exp(logits - shift[..., None]), axis=-1))
        return jnp.einsum("bhqk,bhkd->bhqd", weights.astype(q.dtype), v, precision="highest"), lse

    @staticmethod
    def _uniform_scores(q, k, v, keep, bias, scale, capped, cap, slopes, offset, has_sink, sink):
        """The scores _sdpa_uniform's softmax sees (-inf at a removed key), the sink logits (-inf: none) and v with
        its kv heads repeated."""
        import jax.numpy as jnp

        group = head_groups(q, k)
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
        return scores, jnp.where(has_sink, sink[:, :, None, None].astype(scores.dtype), -jnp.inf), v

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
        variants = used_variants(window=None if window is None else tuple(window), softcap=softcap,
                         alibi_slopes=alibi_slopes, query_offset=int(query_offset), key_lengths=key_lengths,
                         learnable_sink=learnable_sink, sink_token_length=int(sink_token_length),
                         attention_chunk=None if attention_chunk is None else int(attention_chunk),
                         key_leftpad=key_leftpad)
        if not jax_jit.traced(query, key, value, mask, *params.values()):
            return JaxNumpy._mha_in_buckets(query, key, value, params, num_heads, mask, is_causal, **variants)
        if differentiated_eagerly(query, key, value, *params.values(), learnable_sink) \
                and not jax_jit.traced(mask, alibi_slopes, key_lengths, key_leftpad):
            return JaxNumpy._mha_vjp_in_buckets(query, key, value, params, num_heads, mask, is_causal, **variants)
        # The projections too: "highest" makes every float32 matmul of the traced program full precision.
        with jax.default_matmul_precision("highest"):
            return jax_mha(JaxNumpy._sdpa, query, key, value, params, num_heads, mask, is_causal, **variants)

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

        q, k, v = (split_heads(project(x, name), num_heads, np) for x, name in ((query, "q"), (key, "k"),
                                                                                (value, "v")))
        context = np.asarray(JaxNumpy._sdpa_in_buckets(q, k, v, mask, is_causal, None, **variants))
        return jax.device_put(project(merge_heads(context, np), "o"))

    @staticmethod
    def _mha_vjp_in_buckets(query, key, value, params, num_heads, mask, is_causal, learnable_sink=None, **variants):
        """multi_head_attention under an eager jax.vjp (the multi-head gradient tests, grad.mha): a custom_vjp whose
        forward is _mha_in_buckets' (projections and the heads' attention in their buckets) and whose backward is the
        chain rule on the same buckets: each projection's vjp one jitted program per bucket (_affine_vjp), the heads'
        attention the sdpa gradients' (_uniform_vjp). The whole pipeline jitted (jax_mha) compiled a forward and a
        backward per case shape, 10-14 s of CPU per test. Differentiated: query, key, value, every parameter and the
        learnable sink; the mask and every other keyword are constants."""
        import jax

        saved = {}

        @jax.custom_vjp
        def attend(query, key, value, weights, sink):  # only its vjp runs (forward, backward): the rules' primal
            raise NotImplementedError("jax_numpy's differentiable multi_head_attention runs under an eager jax.vjp")

        def forward(query, key, value, weights, sink):
            p = {name: np.asarray(array) for name, array in weights.items()}
            x = {"q": np.asarray(query), "k": np.asarray(key), "v": np.asarray(value)}
            heads = {n: split_heads(JaxNumpy._project_in_buckets(x[n], p["w_" + n], p.get("b_" + n)), num_heads, np)
                     for n in "qkv"}
            layout = _Buckets(heads["q"], heads["k"], heads["v"], mask, is_causal, None, learnable_sink=sink,
                              **variants)
            merged = merge_heads(layout.output(jax_jit.jitted(JaxNumpy._sdpa_uniform)(*layout.padded,
                                                                                      **layout.options)), np)
            saved.update(p=p, x=x, layout=layout, merged=merged, sink=sink)
            return jax.device_put(JaxNumpy._project_in_buckets(merged, p["w_o"], p.get("b_o"))), None

        def backward(_, d_out):
            p, layout = saved["p"], saved["layout"]
            d_merged, grads = JaxNumpy._affine_vjp_in_buckets(saved["merged"], p, "o", np.asarray(d_out))
            found = jax_jit.jitted(JaxNumpy._uniform_vjp)(*layout.padded,
                                                          layout.padded_output(split_heads(d_merged, num_heads, np)),
                                                          **layout.options)
            dq, dk, dv, _, dsink = layout.gradients(found, None, saved["sink"])
            d_inputs = {}
            for n, d_heads in (("q", dq), ("k", dk), ("v", dv)):
                d_inputs[n], more = JaxNumpy._affine_vjp_in_buckets(saved["x"][n], p, n,
                                                                    merge_heads(np.asarray(d_heads), np))
                grads.update(more)
            put = jax.device_put
            return (put(d_inputs["q"]), put(d_inputs["k"]), put(d_inputs["v"]),
                    {name: put(grads[name]) for name in p}, dsink)

        attend.defvjp(forward, backward)
        return attend(query, key, value, dict(params), learnable_sink)

    @staticmethod
    def _affine_vjp_in_buckets(x: np.ndarray, params: dict, name: str, d_y: np.ndarray) -> tuple:
        """(dx, {"w_name": dw, "b_name": db}) of y = x @ w_name + b_name for upstream d_y, one jitted program per
        bucket of _project_in_buckets' sizes (zeros padded, cut off on the host); no db without a bias."""
        weight, bias = params["w_" + name], params.get("b_" + name)
        rows = x.reshape(-1, x.shape[-1])
        (n, e), f = rows.shape, weight.shape[1]
        n2, e2, f2 = bucket_size(n, 32), bucket_size(e, 32), bucket_size(f, 32)
        padded_bias = np.zeros(f2, weight.dtype) if bias is None else pad_to(np.asarray(bias), (f2,))
        dx, dw, db = (np.asarray(g) for g in jax_jit.jitted(JaxNumpy._affine_vjp)(
            pad_to(rows, (n2, e2)), pad_to(weight, (e2, f2)), padded_bias, pad_to(d_y.reshape(-1, f), (n2, f2))))
        grads = {"w_" + name: np.ascontiguousarray(dw[:e, :f])}
        if bias is not None:
            grads["b_" + name] = np.ascontiguousarray(db[:f])
        return np.ascontiguousarray(dx[:n, :e].reshape(x.shape)), grads

    @staticmethod
    def _affine_vjp(x, weight, bias, d_y):
        """The vjp of _affine at (x, weight, bias) for upstream d_y: (dx, dweight, dbias)."""
        import jax

        return jax.vjp(JaxNumpy._affine, x, weight, bias)[1](d_y)

    @staticmethod
    def _project_in_buckets(x: np.ndarray, weight: np.ndarray, bias) -> np.ndarray:
        """x @ weight + bias in x's dtype, one jitted program per bucket: the rows (every leading axis) padded to a
        power of two (at least 32), both widths likewise; the padding is zeros, which add nothing to a dot product,
        and is cut off on the host."""
        rows = x.reshape(-1, x.shape[-1])
        (n, e), f = rows.shape, weight.shape[1]
        n2, e2, f2 = bucket_size(n, 32), bucket_size(e, 32), bucket_size(f, 32)
        bias = np.zeros(f2, weight.dtype) if bias is None else pad_to(np.asarray(bias), (f2,))
        out = jax_jit.jitted(JaxNumpy._affine)(pad_to(rows, (n2, e2)), pad_to(weight, (e2, f2)), bias)
        return np.asarray(out)[:n, :f].reshape(x.shape[:-1] + (f,))

    @staticmethod
    def _affine(x, weight, bias):
        import jax.numpy as jnp

        # precision HIGHEST: float32 matmuls at float32 precision on GPUs too (JAX's default there is TF32).
        return jnp.matmul(x, weight, precision="highest") + bias

    # Packed and paged batches: one jitted program each, whatever the variants (every option an array,
    # neutral where unused), fed arrays padded on the host to bucket sizes (bucket_size; head dims to a multiple
    # of 8, zeros that change no dot product): a new packed length, cache size or head dim costs no compile within its
    # bucket. The sequences' structure (offsets, used lengths, the alignment) is read on the host into a keep mask
    # and the ALiBi distances; the pages are gathered in the program through the block table.
    @staticmethod
    def _options(q, scale, softcap, learnable_sink, hq: int):
        dk = q.shape[-1]
        sink = np.full(hq, -np.inf) if learnable_sink is None else host_floats(learnable_sink)
        return dict(scale=np.float64(1.0 / math.sqrt(dk) if scale is None else scale), sink=sink,
                    cap=np.float64(1.0 if softcap is None else softcap), capped=np.bool_(softcap is not None))

    @staticmethod
    def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                    seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None):
        import jax

        options = dict(seqused_k=seqused_k, window=window, softcap=softcap, alibi_slopes=alibi_slopes)
        if jax_jit.traced(q, k, v, learnable_sink):
            if not differentiated_eagerly(q, k, v, learnable_sink) or jax_jit.traced(cu_seqlens_q, cu_seqlens_k,
                                                                                     seqused_k, alibi_slopes):
                raise NotImplementedError("jax_numpy reads a packed batch's sequences on the host: its sdpa_varlen "
                                          "is differentiated under an eager jax.vjp, not traced under jit")
            return JaxNumpy._varlen_vjp(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, learnable_sink,
                                        **options)
        layout = _Packed(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, learnable_sink=learnable_sink,
                         **options)
        # device_put: jnp.asarray of a NumPy array compiles a program (lax.stage) per shape
        return jax.device_put(layout.output(jax_jit.jitted(JaxNumpy._packed)(*layout.padded, **layout.options)))

    @staticmethod
    def _varlen_vjp(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, learnable_sink, **options):
        """sdpa_varlen under an eager jax.vjp (the packed-batch gradient tests; grad.varlen): a custom_vjp whose
        forward is the forward tests' program on the concrete values in their buckets (_Packed) and whose backward is
        one jitted vjp of _packed per bucket, cut back as the output is (padded rows take a zero upstream gradient,
        padded keys a zero weight). Differentiated: q, k, v and the learnable sink; the offsets, seqused_k, ALiBi
        slopes and the window are constants."""
        import jax

        bucket = {}  # the forward's layout, which the backward reuses

        @jax.custom_vjp
        def attend(q, k, v, sink):  # only its vjp runs (forward, backward); this is the rule's primal
            raise NotImplementedError("jax_numpy's differentiable sdpa_varlen runs under an eager jax.vjp only")

        def forward(q, k, v, sink):
            where = bucket["layout"] = _Packed(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale,
                                               learnable_sink=sink, **options)
            return jax.device_put(where.output(jax_jit.jitted(JaxNumpy._packed)(*where.padded, **where.options))), \
                sink

        def backward(sink, d_out):
            where = bucket["layout"]
            grads = jax_jit.jitted(JaxNumpy._packed_vjp)(*where.padded, where.padded_output(d_out), **where.options)
            return where.gradients(grads, sink)

        attend.defvjp(forward, backward)
        return attend(q, k, v, learnable_sink)

    @staticmethod
    def _packed_vjp(q, k, v, keep, distance, slopes, d_out, **options):
        """The vjp of _packed at a bucket: (dq, dk, dv, dsink) for upstream d_out."""
        import jax

        def attend(q, k, v, sink):
            return JaxNumpy._packed(q, k, v, keep, distance, slopes, **dict(options, sink=sink))

        return jax.vjp(attend, q, k, v, options["sink"])[1](d_out)

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
        table = host_ints(block_table).astype(np.int32)
        (b, hq, lq, dk), (pages, block, hkv, dv) = qh.shape, vc.shape
        keys = table.shape[1] * block
        keep = paged_mask(seqused_k, lq, keys, is_causal, window, None, hq)[:, 0]
        used = host_ints(seqused_k).reshape(-1, 1, 1)
        distance = np.abs(np.arange(lq).reshape(1, lq, 1) + (used - lq) - np.arange(keys).reshape(1, 1, keys))
        slopes = np.zeros((b, hq)) if alibi_slopes is None else np.broadcast_to(host_floats(alibi_slopes), (b, hq))
        # Batch, rows, pages, table width, page size, heads and head dims padded to buckets (one program per bucket):
        # each page's padded slots and the table's padded entries are keys not kept, padded rows and heads cut off.
        bb, ll, pp, mb = bucket_size(b, 4), bucket_size(lq, 8), bucket_size(pages, 8), bucket_size(table.shape[1], 4)
        block2, dk2, dv2, heads = bucket_size(block, 4), bucket_size(dk, 8), bucket_size(dv, 8), HeadBucket(hq, hkv)

        def per_slot(x, fill):  # (B, Lq, blocks * block) -> (bb, ll, mb * block2): each page's slots padded
            x = pad_to(x.reshape(b, lq, table.shape[1], block), (bb, ll, mb, block2), fill)
            return x.reshape(bb, ll, mb * block2)

        options = JaxNumpy._options(qh, scale, softcap, learnable_sink, hq)
        options["sink"] = heads.query(options["sink"], 0, -np.inf)
        out = jax_jit.jitted(JaxNumpy._paged)(
            pad_to(heads.query(qh, 1), (bb, heads.hkv2 * heads.group2, ll, dk2)),
            pad_to(kc, (pp, block2, heads.hkv2, dk2)), pad_to(vc, (pp, block2, heads.hkv2, dv2)),
            pad_to(table, (bb, mb)), per_slot(keep, False), per_slot(distance.astype(np.float64), 0),
            pad_to(heads.query(np.asarray(slopes), 1), (bb, heads.hkv2 * heads.group2)), **options)
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
        self.group, self.entries = head_groups(q, k), self.b * self.hkv
        self.rows, self.keys = bucket_size(self.lq, 32), bucket_size(self.lk, 32)
        self.dk2, self.dv2 = bucket_size(self.dk, 64), bucket_size(self.dv, 64)
        small = self.rows * self.keys * bucket_size(self.entries, 4) * bucket_size(self.group, 4) <= SMALL_BUCKET_SCORES
        least = 4 if small else 2
        self.entries2, self.group2 = bucket_size(self.entries, least), bucket_size(self.group, least)
        options = JaxNumpy._uniform_options(np, q, k, None if mask is None else np.asarray(mask), is_causal, scale,
                                            **variants)
        options.update(keep=self.heads(options["keep"], (self.rows, self.keys), False),
                       bias=self.heads(options["bias"], (self.rows, self.keys)),
                       slopes=self.heads(options["slopes"], ()), sink=self.heads(options["sink"], ()))
        self.options = options
        kv = (self.entries2, 1, self.keys)
        self.padded = (self.heads(q, (self.rows, self.dk2)),
                       pad_to(k.reshape(self.entries, 1, self.lk, self.dk), kv + (self.dk2,)),
                       pad_to(v.reshape(self.entries, 1, self.lk, self.dv), kv + (self.dv2,)))

    def heads(self, x, trailing, fill=0):
        """(B, Hq, ...) -> (entries2, group2, *trailing): entry b * Hkv + kv holds kv head kv's query heads of b."""
        x = np.asarray(x)
        return pad_to(x.reshape((self.entries, self.group) + x.shape[2:]), (self.entries2, self.group2) + trailing,
                       fill)

    def _real(self, x, *sizes) -> np.ndarray:
        """The real (B, Hq, ...) part of a padded (entries2, group2, ...) array, cut on the host (a slice of a jax
        array compiles, and so does jnp.asarray of a numpy array)."""
        x = np.asarray(x)[(slice(self.entries), slice(self.group)) + tuple(slice(n) for n in sizes)]
        return np.ascontiguousarray(x.reshape((self.b, self.hq) + x.shape[2:]))

    def output(self, out) -> np.ndarray:
        """The (B, Hq, Lq, Dv) output of the padded (entries2, group2, rows, dv2) one."""
        return self._real(out, self.lq, self.dv)

    def row_values(self, per_row) -> np.ndarray:
        """The (B, Hq, Lq) rows of a padded (entries2, group2, rows) per-row array (the log-sum-exp)."""
        return self._real(per_row, self.lq)

    def padded_output(self, d_out) -> np.ndarray:
        """An upstream gradient of the output, padded with zeros: the padding contributes nothing."""
        return self.heads(d_out, (self.rows, self.dv2))

    def gradients(self, grads, bias, sink) -> tuple:
        """(dq, dk, dv, dbias, dsink) of the real arguments, from the bucket's: each cut, dbias summed to the float
        mask's own (broadcast) shape, dsink over the batch to (Hq,); None for an argument that was not given."""
        import jax

        from attention_conformance.conformance.reference.backward import reduce_to_shape

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


class _Packed:
    """One sdpa_varlen case of concrete arrays laid out in its bucket (JaxNumpy.sdpa_varlen): rows, keys, heads and
    head dims padded to buckets (one program per bucket), the sequences' structure read on the host into the kept
    keys and the ALiBi distances; padded keys are not kept, padded rows and query heads cut off. ``padded``: _packed's
    (q, k, v, keep, distance, slopes); ``options``: its other arguments by name."""

    def __init__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, scale, *, seqused_k=None, window=None,
                 softcap=None, alibi_slopes=None, learnable_sink=None):
        qh, kh, vh = np.asarray(q), np.asarray(k), np.asarray(v)
        (self.rows, hq, self.dk), (self.cols, self.hkv, self.dv) = qh.shape, vh.shape
        query_seq, query_position, key_seq, key_position, used = packed_positions(cu_seqlens_q, cu_seqlens_k,
                                                                                    seqused_k)
        keep = (query_seq[:, None] == key_seq[None, :]) & used[None, :] \
            & sequence_keep(query_position[:, None], key_position[None, :], is_causal, window)
        distance = np.abs(query_position[:, None] - key_position[None, :]).astype(np.float64)
        r, c, dk2, dv2 = bucket_size(self.rows, 32), bucket_size(self.cols, 32), bucket_size(self.dk, 8), \
            bucket_size(self.dv, 8)
        self.heads = heads = HeadBucket(hq, self.hkv)
        self.options = JaxNumpy._options(qh, scale, softcap, learnable_sink, hq)
        self.options["sink"] = heads.query(self.options["sink"], 0, -np.inf)
        self.padded = (pad_to(heads.query(qh, 1), (r, heads.hkv2 * heads.group2, dk2)),
                       pad_to(kh, (c, heads.hkv2, dk2)), pad_to(vh, (c, heads.hkv2, dv2)),
                       pad_to(keep, (r, c), False), pad_to(distance, (r, c)),
                       pad_to(heads.query(per_row_slopes(alibi_slopes, query_seq, hq), 0),
                              (heads.hkv2 * heads.group2, r)))

    def output(self, out) -> np.ndarray:
        """The (total_q, Hq, Dv) output of the padded one."""
        return np.ascontiguousarray(self.heads.real(np.asarray(out)[:self.rows, :, :self.dv], 1))

    def padded_output(self, d_out) -> np.ndarray:
        """An upstream gradient of the output padded with zeros (the padding contributes nothing)."""
        q = self.padded[0]
        return pad_to(self.heads.query(np.asarray(d_out), 1), (q.shape[0], q.shape[1], self.padded[2].shape[2]))

    def gradients(self, grads, sink) -> tuple:
        """(dq, dk, dv, dsink) of the real arguments, cut from the bucket's; dsink None without a sink."""
        import jax

        dq, dk, dv, dsink = (np.asarray(g) for g in grads)
        out = [self.heads.real(dq[:self.rows, :, :self.dk], 1), dk[:self.cols, :self.hkv, :self.dk],
               dv[:self.cols, :self.hkv, :self.dv],
               None if sink is None else self.heads.real(dsink, 0).astype(np.asarray(sink).dtype)]
        return tuple(None if g is None else jax.device_put(np.ascontiguousarray(g)) for g in out)

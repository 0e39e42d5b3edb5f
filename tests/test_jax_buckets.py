"""jax_numpy's buckets (implementations/builtin.py, JaxNumpy._sdpa_in_buckets, _mha_in_buckets, and the _HeadBucket
of sdpa_varlen and sdpa_paged): concrete arrays are
padded on the host to a few program shapes (lengths, head dims, batch, kv heads, query heads per kv head) and cut
after; the result is the unpadded computation's, and every shape inside a bucket runs one compiled program."""
from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.implementations.builtin import jax_jit
from attention_conformance.implementations.builtin.jax_numpy import JaxNumpy

from .jax_vjp import assert_eager_vjp_equals_the_jitted

jax = pytest.importorskip("jax")

pytestmark = pytest.mark.selfcheck


def _inputs(b, hq, hkv, lq, lk, dk, dv, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, hq, lq, dk)).astype(np.float32),
            rng.standard_normal((b, hkv, lk, dk)).astype(np.float32),
            rng.standard_normal((b, hkv, lk, dv)).astype(np.float32))


def _unpadded(q, k, v, mask=None, is_causal=False, scale=None, **variants):
    """The same sdpa traced at the case's own shapes (the path gradients take): no bucket, no padding."""
    return np.asarray(jax.jit(lambda q, k, v, mask: JaxNumpy.sdpa(q, k, v, mask, is_causal, scale, **variants))(
        q, k, v, mask))


def _signatures_of(monkeypatch, target) -> set:
    """The (shape, dtype) signatures ``target`` (a jitted JaxNumpy body) is called with from now on."""
    signatures: set = set()
    real = jax_jit.jitted

    def recording(fn, *static):
        program = real(fn, *static)
        if fn is not target:
            return program

        def call(*args, **kwargs):
            arrays = (*args, *(kwargs[name] for name in sorted(kwargs)))
            signatures.add(tuple((np.shape(a), np.asarray(a).dtype.name) for a in arrays))
            return program(*args, **kwargs)
        return call

    monkeypatch.setattr(jax_jit, "jitted", recording)
    return signatures


CASES = {
    # (B, Hq, Hkv, Lq, Lk, Dk, Dv), the call's options: small cases pad batch and heads to at least 4
    "gqa-bool-mask-causal": ((3, 6, 2, 5, 9, 7, 5), dict(is_causal=True), "bool"),
    "one-kv-head-float-mask-scale": ((2, 3, 1, 4, 4, 3, 3), dict(scale=-0.7), "float"),
    "window-alibi-sink-lengths": ((2, 4, 2, 6, 11, 5, 6), dict(
        window=(2, 1), alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625], np.float32),
        learnable_sink=np.array([0.3, -1.0, 0.0, 2.0], np.float32), key_lengths=np.array([11, 4], np.int32),
        query_offset=3), None),
    "chunk-leftpad-sink-tokens": ((2, 2, 2, 7, 7, 4, 4), dict(
        attention_chunk=3, key_leftpad=np.array([0, 2], np.int32), sink_token_length=1, softcap=5.0), None),
    # past SMALL_BUCKET_SCORES: batch and heads padded to powers of two only
    "large-gqa": ((1, 6, 3, 70, 130, 24, 24), dict(is_causal=True), None),
}


@pytest.mark.parametrize("name", CASES)
def test_a_bucketed_sdpa_equals_the_unpadded_computation(name):
    (b, hq, hkv, lq, lk, dk, dv), options, mask_kind = CASES[name]
    q, k, v = _inputs(b, hq, hkv, lq, lk, dk, dv)
    rng = np.random.default_rng(1)
    mask = None if mask_kind is None else (rng.random((b, hq, lq, lk)) < 0.7 if mask_kind == "bool"
                                           else rng.standard_normal((1, hq, lq, lk)).astype(np.float32))
    if mask_kind == "bool":
        mask[..., 0] = True  # no row left without a key
    bucketed = np.asarray(JaxNumpy.sdpa(q, k, v, mask, **options))
    assert bucketed.shape == (b, hq, lq, dv)
    kwargs = dict(options)
    is_causal, scale = kwargs.pop("is_causal", False), kwargs.pop("scale", None)
    np.testing.assert_allclose(bucketed, _unpadded(q, k, v, mask, is_causal, scale, **kwargs), rtol=2e-5, atol=2e-6)


def test_every_shape_inside_a_bucket_runs_one_program(monkeypatch):
    signatures = _signatures_of(monkeypatch, JaxNumpy._sdpa_uniform)  # one signature, one XLA program
    # (B, Hq, Hkv, Lq, Lk, Dk, Dv): at most 4 (batch entry, kv head) pairs, 4 query heads per kv head, lengths up
    # to 32 and head dims up to 64
    small = [(1, 1, 1, 1, 1, 1, 1), (1, 1, 1, 2, 3, 5, 5), (2, 3, 1, 9, 17, 13, 13), (1, 4, 4, 30, 31, 20, 32),
             (2, 8, 2, 32, 32, 64, 64), (1, 16, 4, 3, 3, 8, 8)]
    for shape in small:
        JaxNumpy.sdpa(*_inputs(*shape))
    assert len(signatures) == 1
    JaxNumpy.sdpa(*_inputs(1, 1, 1, 33, 3, 5, 5))  # Lq past the smallest bucket: another program
    assert len(signatures) == 2


def test_a_bucketed_multi_head_attention_equals_the_traced_pipeline():
    rng = np.random.default_rng(2)
    b, lq, lk, e, heads = 2, 5, 9, 12, 3
    query, key, value = (rng.standard_normal((b, n, e)).astype(np.float32) for n in (lq, lk, lk))
    params = {f"w_{n}": (rng.standard_normal((e, e)) / np.sqrt(e)).astype(np.float32) for n in "qkvo"}
    params |= {"b_q": rng.standard_normal(e).astype(np.float32), "b_o": rng.standard_normal(e).astype(np.float32)}
    mask = rng.random((lq, lk)) < 0.8
    mask[:, 0] = True
    bucketed = np.asarray(JaxNumpy.multi_head_attention(query, key, value, params, heads, mask=mask, window=(3, 0)))
    traced = np.asarray(jax.jit(lambda query, key, value, params: JaxNumpy.multi_head_attention(
        query, key, value, params, heads, mask=mask, window=(3, 0)))(query, key, value, params))
    assert bucketed.shape == (b, lq, e)
    np.testing.assert_allclose(bucketed, traced, rtol=2e-5, atol=2e-6)


GRADIENT_CASES = {
    # (B, Hq, Hkv, Lq, Lk, Dk, Dv), the call's constant options, the differentiated float mask's shape (None: a
    # boolean mask or none), whether a learnable sink is differentiated
    "gqa-broadcast-float-mask": ((2, 6, 2, 5, 9, 7, 5), dict(is_causal=True), (5, 9), False),
    "per-head-float-mask-sink": ((1, 4, 4, 3, 6, 4, 4), dict(scale=0.4), (1, 4, 3, 6), True),
    "window-alibi-lengths-bool": ((2, 4, 2, 6, 11, 5, 6), dict(
        window=(2, 1), alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625], np.float32),
        key_lengths=np.array([11, 4], np.int32), softcap=3.0), None, True),
    "large-one-kv-head": ((1, 3, 1, 40, 70, 40, 24), dict(), None, False),
}


@pytest.mark.parametrize("name", GRADIENT_CASES)
def test_bucketed_gradients_equal_the_traced_gradients(name):
    """Under an eager jax.vjp (the gradient tests) jax_numpy pads into its buckets (JaxNumpy._sdpa_vjp_in_buckets);
    under jit it differentiates the unpadded traced sdpa. Same gradients: dq, dk, dv, a float mask's (summed to its
    broadcast shape) and a sink's."""
    (b, hq, hkv, lq, lk, dk, dv), options, mask_shape, with_sink = GRADIENT_CASES[name]
    q, k, v = _inputs(b, hq, hkv, lq, lk, dk, dv, seed=3)
    rng = np.random.default_rng(4)
    mask = rng.standard_normal(mask_shape).astype(np.float32) if mask_shape else None
    boolean = None
    if mask is None and name.endswith("bool"):
        boolean = rng.random((b, hq, lq, lk)) < 0.7
        boolean[..., 0] = True
    sink = rng.standard_normal(hq).astype(np.float32) if with_sink else None
    primals = [q, k, v] + ([mask] if mask is not None else []) + ([sink] if sink is not None else [])
    d_out = rng.standard_normal((b, hq, lq, dv)).astype(np.float32)

    def attention(q, k, v, *rest):
        rest = list(rest)
        float_mask = rest.pop(0) if mask is not None else None
        learnable = rest.pop(0) if sink is not None else None
        return JaxNumpy.sdpa(q, k, v, boolean if float_mask is None else float_mask, learnable_sink=learnable,
                             **options)

    assert_eager_vjp_equals_the_jitted(attention, primals, d_out)


def test_an_eager_vjp_runs_the_bucketed_backward(monkeypatch):
    """The bucketed backward is what an eager jax.vjp runs (not the traced path), one program for a bucket."""
    called = []
    real = jax_jit.jitted

    def recording(fn, *static):
        if fn is JaxNumpy._uniform_vjp:
            called.append(fn)
        return real(fn, *static)

    monkeypatch.setattr(jax_jit, "jitted", recording)
    for shape in [(1, 2, 1, 3, 5, 4, 4), (2, 4, 2, 7, 6, 8, 8)]:
        q, k, v = _inputs(*shape)
        jax.vjp(lambda q, k, v: JaxNumpy.sdpa(q, k, v), q, k, v)[1](np.ones(q.shape[:3] + (v.shape[3],), np.float32))
    assert len(called) == 2


def _paged_inputs(b, hq, hkv, lq, block, blocks, d, seed=0):
    rng = np.random.default_rng(seed)
    pages = b * blocks + 1
    q = rng.standard_normal((b, hq, lq, d)).astype(np.float32)
    caches = [rng.standard_normal((pages, block, hkv, d)).astype(np.float32) for _ in range(2)]
    table = rng.permutation(pages)[:b * blocks].reshape(b, blocks).astype(np.int32)
    used = rng.integers(lq, blocks * block + 1, size=b).astype(np.int32)
    return q, *caches, table, used


def _paged_variants(hq):
    return dict(window=(3, None), softcap=4.0, alibi_slopes=np.linspace(0.1, 0.5, hq).astype(np.float32),
                learnable_sink=np.linspace(-1.0, 1.0, hq).astype(np.float32))


def test_bucketed_paged_and_packed_attention_equal_numpy_native():
    """Heads (GQA, 6 query heads on 2 kv heads), page size, rows and head dims padded: NumpyNative's results, which
    compute every sequence at its own shapes."""
    from attention_conformance.implementations.builtin.numpy_backend import NumpyNative

    q, kc, vc, table, used = _paged_inputs(2, 6, 2, 3, 3, 4, 5)
    for variants in ({}, _paged_variants(6)):
        got = np.asarray(JaxNumpy.sdpa_paged(q, kc, vc, table, used, True, None, **variants))
        want = NumpyNative.sdpa_paged(q, kc, vc, table, used, True, None, **variants)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    rng = np.random.default_rng(3)
    cu_q, cu_k = np.array([0, 3, 8], np.int32), np.array([0, 5, 12], np.int32)
    q, k, v = (rng.standard_normal((n, h, 5)).astype(np.float32) for n, h in ((8, 6), (12, 2), (12, 2)))
    for variants in ({}, _paged_variants(6)):
        got = np.asarray(JaxNumpy.sdpa_varlen(q, k, v, cu_q, cu_k, 5, 7, True, 0.3, **variants))
        want = NumpyNative.sdpa_varlen(q, k, v, cu_q, cu_k, 5, 7, True, 0.3, **variants)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_paged_caches_of_other_head_layouts_and_page_sizes_run_one_program(monkeypatch):
    signatures = _signatures_of(monkeypatch, JaxNumpy._paged)
    # (B, Hq, Hkv, Lq, page size, blocks per sequence, D): up to 4 of each head kind, pages of up to 4 slots
    for shape in ((1, 1, 1, 1, 1, 2, 8), (2, 3, 1, 2, 3, 2, 8), (2, 3, 3, 4, 2, 3, 5), (1, 8, 4, 1, 4, 4, 8)):
        JaxNumpy.sdpa_paged(*_paged_inputs(*shape))
    assert len(signatures) == 1


@pytest.mark.parametrize("seed", range(40))
def test_the_keys_attended_under_a_trace_are_the_oracles(seed):
    """_attended_keys under a trace (the traced paths' keep mask: oracle.positions_allowed in jax.numpy, the key
    lengths and left pads tracers) keeps exactly the keys the NumPy rule and the boolean mask leave, for every variant
    that removes keys."""
    from attention_conformance.conformance.reference import oracle

    rng = np.random.default_rng(seed)
    b, hq, lq, lk = 2, 2, int(rng.integers(1, 9)), int(rng.integers(1, 12))
    pick = lambda: bool(rng.integers(2))  # noqa: E731
    window = (None if pick() else int(rng.integers(0, 5)), None if pick() else int(rng.integers(0, 5))) \
        if pick() else None
    variants = dict(window=window, query_offset=int(rng.integers(0, 4)),
                    key_lengths=rng.integers(0, lk + 1, size=b) if pick() else None,
                    sink_token_length=int(rng.integers(0, 3)) if window is not None else 0,
                    attention_chunk=int(rng.integers(1, 5)) if pick() else None,
                    key_leftpad=rng.integers(0, lk, size=b) if pick() else None)
    is_causal, keep = pick(), rng.random((b, hq, lq, lk)) < 0.8 if pick() else None
    want = np.broadcast_to(oracle.positions_allowed(lq, lk, is_causal, **variants) & (True if keep is None else keep),
                           (b, hq, lq, lk))

    def traced(key_lengths, key_leftpad):
        return JaxNumpy._attended_keys(jax.numpy, (b, hq, lq, lk), keep, is_causal, window, variants["query_offset"],
                                       key_lengths, variants["sink_token_length"], variants["attention_chunk"],
                                       key_leftpad)

    np.testing.assert_array_equal(np.asarray(jax.jit(traced)(variants["key_lengths"], variants["key_leftpad"])), want)

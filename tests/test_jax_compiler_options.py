"""The JAX built-ins' CPU programs compile with XLA's elemental emitters (implementations/builtin.py,
CPU_COMPILER_OPTIONS): 40 % less compile time, and the same bits as XLA's default fusion emitters. These checks
hold every kind of built-in program to those bits (forward, gradients, multi-head, softmax, variants, float64),
keep the options to the CPU and to the built-ins' own programs, and fall back to XLA's defaults where a jaxlib
does not take them or its probe program's bits differ."""
from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.implementations.builtin import jax_jit
from attention_conformance.implementations.builtin.jax_backend import JaxDotProductAttention
from attention_conformance.implementations.builtin.jax_numpy import JaxNumpy

jax = pytest.importorskip("jax")

pytestmark = pytest.mark.selfcheck


def _arrays(*shapes, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape in shapes]


def _mha_params(e, seed=3):
    names = ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o")
    shapes = [(e, e)] * 4 + [(e,)] * 4
    return dict(zip(names, _arrays(*shapes, seed=seed)))


def _dpa_sdpa_bool_causal():
    q, k, v = _arrays((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8))
    mask = np.random.default_rng(1).random((2, 4, 5, 7)) < 0.7
    return JaxDotProductAttention.sdpa(q, k, v, mask, is_causal=True)


def _dpa_sdpa_float_mask_scale():
    q, k, v, bias = _arrays((1, 2, 9, 16), (1, 1, 9, 16), (1, 1, 9, 16), (1, 2, 9, 9))
    return JaxDotProductAttention.sdpa(q, k, v, bias, scale=-0.35)


def _dpa_variants():
    q, k, v = _arrays((2, 2, 6, 8), (2, 1, 11, 8), (2, 1, 11, 8))
    return JaxDotProductAttention.sdpa(q, k, v, window=(3, 1), alibi_slopes=np.array([0.5, 0.25], np.float32),
                                       key_lengths=np.array([11, 6], np.int32))


def _dpa_gradients():
    q, k, v, d_out = _arrays((1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 5, 8))
    return jax.vjp(lambda q, k, v: JaxDotProductAttention.sdpa(q, k, v, is_causal=True), q, k, v)[1](d_out)


def _dpa_mha():
    query, key = _arrays((2, 5, 8), (2, 7, 8))
    return JaxDotProductAttention.multi_head_attention(query, key, key, _mha_params(8), num_heads=2, is_causal=False)


def _dpa_softmax():
    (x,) = _arrays((3, 7, 40))
    return JaxDotProductAttention.softmax(x * 10.0)


def _numpy_sdpa_softcap():
    q, k, v = _arrays((1, 3, 6, 8), (1, 3, 10, 8), (1, 3, 10, 4))
    return JaxNumpy.sdpa(q, k, v, is_causal=True, softcap=2.5)


def _numpy_sdpa_float64():
    q, k, v, bias = _arrays((2, 2, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8), (2, 1, 5, 5), dtype=np.float64)
    with jax.enable_x64(True):
        return np.asarray(JaxNumpy.sdpa(q, k, v, bias, scale=0.2))


def _numpy_gradients():
    q, k, v, d_out = _arrays((1, 2, 5, 8), (1, 1, 9, 8), (1, 1, 9, 8), (1, 2, 5, 8))
    return jax.vjp(lambda q, k, v: JaxNumpy.sdpa(q, k, v, window=(2, 2)), q, k, v)[1](d_out)


def _numpy_mha():
    query, key = _arrays((1, 6, 12), (1, 4, 12))
    return JaxNumpy.multi_head_attention(query, key, key, _mha_params(12), num_heads=3, is_causal=False)


PROGRAMS = {name[1:]: program for name, program in globals().items() if name.startswith(("_dpa_", "_numpy_"))}


def _run_with(monkeypatch, options, program):
    """``program``'s results (as NumPy) with the built-ins' CPU programs compiled with ``options`` (None: XLA's
    defaults), every program compiled afresh."""
    monkeypatch.setattr(jax_jit, "cpu_compiler_options", lambda: options)
    monkeypatch.setattr(jax_jit, "JITTED", {})
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(program())]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_cpu_options_give_the_builtins_the_bits_of_xlas_defaults(monkeypatch, name):
    if jax_jit.cpu_compiler_options() is None:
        pytest.skip("this jaxlib does not take the options or its probe's bits differ: the built-ins use its defaults")
    tuned = _run_with(monkeypatch, dict(jax_jit.CPU_COMPILER_OPTIONS), PROGRAMS[name])
    default = _run_with(monkeypatch, None, PROGRAMS[name])
    assert [x.shape for x in tuned] == [x.shape for x in default]
    for got, want in zip(tuned, default):
        same = got.dtype == want.dtype and got.tobytes() == want.tobytes()
        assert same, (
            f"{name}: XLA:CPU with {jax_jit.CPU_COMPILER_OPTIONS} differs from its defaults by up to "
            f"{np.max(np.abs(got.astype(np.float64) - want)):.3g}; drop the options (implementations/builtin.py)")


def _options_of_each_jit(monkeypatch) -> list:
    """The compiler_options every jax.jit the built-ins make from now on is given."""
    seen = []
    real = jax.jit

    def recording(fn, **options):
        seen.append(options.get("compiler_options"))
        return real(fn, **options)

    monkeypatch.setattr(jax, "jit", recording)
    monkeypatch.setattr(jax_jit, "JITTED", {})
    return seen


def test_cpu_arrays_compile_with_the_options_and_traced_ones_without(monkeypatch):
    options = dict(jax_jit.CPU_COMPILER_OPTIONS)
    monkeypatch.setattr(jax_jit, "cpu_compiler_options", lambda: options)
    seen = _options_of_each_jit(monkeypatch)
    q, k, v = (jax.device_put(x, jax.devices("cpu")[0]) for x in _arrays((1, 1, 3, 4), (1, 1, 3, 4), (1, 1, 3, 4)))
    JaxDotProductAttention.sdpa(q, k, v)
    assert seen == [options]
    # Inside another program (a user's jit around the built-in) the enclosing program's options decide.
    jax.jit(lambda q: jax_jit.jitted(JaxDotProductAttention._sdpa, "is_causal")(q, k, v))(q)
    assert seen[1:] == [None, None], "the enclosing jit, then the built-in's inside it: no CPU options for a trace"


def test_host_arrays_follow_the_default_backend(monkeypatch):
    assert jax_jit.on_cpu((np.zeros(3),)) is (jax.default_backend() == "cpu")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert jax_jit.on_cpu((np.zeros(3),)) is False


@pytest.mark.parametrize("options", [{"xla_cpu_no_such_option_anywhere": True}, {"xla_cpu_enable_fast_math": True}],
                         ids=["unknown-to-this-jaxlib", "other-bits"])
def test_options_the_probe_refuses_leave_xlas_defaults(monkeypatch, options):
    """An option this jaxlib does not know, or one that changes the probe's bits (fast math reorders its sums and
    approximates its tanh and exp, as elemental emitters that differed from the fusion emitters would): the
    built-ins then compile with XLA's defaults."""
    monkeypatch.setattr(jax_jit, "CPU_COMPILER_OPTIONS", options)
    jax_jit.cpu_compiler_options.cache_clear()
    try:
        assert jax_jit.cpu_compiler_options() is None
    finally:
        jax_jit.cpu_compiler_options.cache_clear()

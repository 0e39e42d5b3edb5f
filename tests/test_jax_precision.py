"""JAX's x64 flag is the suite's business only in float64 cases (implementations/_arrays.py, JaxArrays.precision).

Turned on for the whole process (as it was), x64 changed every JAX case: jnp.arange became int64, and a kernel
that divides it by an int32 (the Pallas flash kernel's causal path, lax.div) raised on its float32 cases.
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.registry import from_object

from .test_cli import pytest_run

pytestmark = pytest.mark.selfcheck
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


class X64Probe:
    """Records the x64 flag and the default integer width each call sees, and computes sdpa in q's dtype."""

    ARRAY = "jax"
    DTYPES = ("float32", "float64")
    seen: list = []

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        X64Probe.seen.append((str(q.dtype), bool(jax.config.jax_enable_x64), str(jnp.arange(2).dtype)))
        out = oracle.sdpa(np.asarray(q, np.float64), np.asarray(k, np.float64), np.asarray(v, np.float64),
                          None if mask is None else np.asarray(mask), is_causal, scale)
        return jnp.asarray(out, dtype=q.dtype)


def _case(seed: int = 0) -> Case:
    rng = np.random.default_rng(seed)
    inputs = {"q": rng.standard_normal((1, 2, 5, 4)), "k": rng.standard_normal((1, 2, 6, 4)),
              "v": rng.standard_normal((1, 2, 6, 4)), "is_causal": True}
    return Case("sdpa", inputs, ("sdpa.definition",), "probe")


@pytest.mark.parametrize("dtype, x64", [("float32", False), ("float64", True)])
def test_x64_is_on_for_float64_cases_only_in_the_calling_thread(dtype, x64, monkeypatch):
    """Through the Judge, whose call runs in a thread under the call time limit (the flag is thread-local)."""
    monkeypatch.setattr(X64Probe, "seen", [])
    impl = from_object(X64Probe, "x64_probe", "tests.test_jax_precision:X64Probe")
    # The contract check inside run fails the case if the output is not in q's dtype (sdpa.output-dtype), so a
    # float64 case truncated to float32 on its way in or out fails here.
    Judge(impl, dtype, "cpu").run(_case())
    assert X64Probe.seen == [(dtype, x64, "int64" if x64 else "int32")]
    assert not jax.config.jax_enable_x64  # nothing leaks into the process


def test_a_float64_array_converted_outside_a_call_keeps_its_precision():
    from attention_conformance.implementations.arrays import ARRAY_KINDS

    value = np.array([1.0 + 2.0**-40])
    native = ARRAY_KINDS["jax"].to_native(value, "cpu")
    assert str(native.dtype) == "float64" and np.asarray(native)[0] == value[0]
    assert not jax.config.jax_enable_x64


BREAKS_UNDER_X64 = textwrap.dedent('''
    """A JAX sdpa whose causal path, like the Pallas flash kernel's, divides jnp.arange by an int32 block."""
    import jax.numpy as jnp
    from jax import lax

    ARRAY = "jax"
    DTYPES = ("float32",)


    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        s = jnp.einsum("bhqd,bhkd->bhqk", q, jnp.repeat(k, q.shape[1] // k.shape[1], axis=1)) * scale
        if mask is not None:
            s = jnp.where(mask, s, -jnp.inf) if mask.dtype == jnp.bool_ else s + mask
        if is_causal:
            block = jnp.int32(1)
            rows = lax.div(jnp.arange(q.shape[-2]), block)  # int64 / int32 under x64: a TypeError
            cols = lax.div(jnp.arange(k.shape[-2]), block)
            s = jnp.where(cols[None, :] <= rows[:, None], s, -jnp.inf)
        top = jnp.max(s, axis=-1, keepdims=True)
        w = jnp.exp(s - jnp.where(jnp.isfinite(top), top, 0.0))
        total = jnp.sum(w, axis=-1, keepdims=True)
        w = w / jnp.where(total == 0, 1.0, total)
        return jnp.einsum("bhqk,bhkd->bhqd", w, jnp.repeat(v, q.shape[1] // k.shape[1], axis=1)).astype(q.dtype)
''')


def test_a_jax_kernel_whose_causal_path_breaks_under_x64_passes_its_float32_cases(tmp_path):
    (tmp_path / "x64_fragile.py").write_text(BREAKS_UNDER_X64)
    done = pytest_run("conformance/test_properties.py", "--impl", "x64_fragile", "-k",
                      "causal_top_left or causal_first_row", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 passed" in done.stdout and "x64_fragile" in done.stdout
    # The stand-in does break under x64 (so the run above shows the flag stayed off for float32).
    import importlib.util

    spec = importlib.util.spec_from_file_location("x64_fragile", tmp_path / "x64_fragile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    q = jnp.zeros((1, 1, 3, 4), jnp.float32)
    with jax.enable_x64(True), pytest.raises(TypeError):
        module.sdpa(q, q, q, is_causal=True)

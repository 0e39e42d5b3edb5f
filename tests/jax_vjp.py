"""What the JAX built-ins' gradient self-checks share: an eager jax.vjp (the gradient tests' path, where the built-ins
run their custom_vjp) against jax.vjp under jit (the plain traced body)."""
from __future__ import annotations

import numpy as np


def assert_eager_vjp_equals_the_jitted(attention, primals: list, d_out) -> None:
    """Output and one gradient per primal (shaped as it) agree between jax.vjp run eagerly and under jax.jit."""
    import jax

    def gradients(*arrays):
        out, pullback = jax.vjp(attention, *arrays)
        return out, pullback(d_out)

    eager_out, eager = gradients(*primals)
    traced_out, traced = jax.jit(gradients)(*primals)
    np.testing.assert_allclose(np.asarray(eager_out), np.asarray(traced_out), rtol=2e-5, atol=2e-6)
    assert len(eager) == len(primals)
    for got, want, primal in zip(eager, traced, primals):
        assert got.shape == primal.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=2e-5)

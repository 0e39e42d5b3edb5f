"""JAX Pallas's GPU flash attention kernel with its residuals (``mha(..., return_residuals=True)``, interpreted on the
CPU): the output and the kernel's lse, as sdpa(..., return_lse=True).

The kernel keeps its lse in base 2 (``lse_ref = m_i + log2(l_i)`` with the scale folded in as log2(e) * sm_scale),
declared below; without the declaration every lse fails lse.base, naming it (docs/real-libraries.md). Its residual
is (B, H, Lq) float32, heads first whatever the layout of q. The region of examples/pallas_flash_interpret.py.
"""
import functools

import jax
from jax.experimental.pallas.ops.gpu import attention

from examples.pallas_flash_interpret import DTYPES, LAYOUT, SUPPORTS, supports  # noqa: F401 -- the same region

ARRAY = "jax"
LSE_CONVENTION = {"base": "2"}

_mha = jax.jit(functools.partial(attention.mha, segment_ids=None, interpret=True, return_residuals=True),
               static_argnames=("sm_scale", "causal"))


def sdpa(q, k, v, is_causal=False, scale=None, return_lse=False):
    out, lse = _mha(q, k, v, sm_scale=q.shape[-1] ** -0.5 if scale is None else float(scale), causal=is_causal)
    return (out, lse) if return_lse else out

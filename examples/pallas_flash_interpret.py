"""JAX Pallas's GPU flash attention kernel (``jax.experimental.pallas.ops.gpu.attention.mha``) run on the CPU in
interpret mode: the kernel's own blocked online-softmax code, without a GPU.

Measured (README, "Real libraries"): with is_causal and Lq > Lk, every row of a query block that reaches past Lk is
NaN: the causal loop's bound, ceil((i + 1) * block_q / block_k) key blocks, is not clamped to Lk's blocks, so the
kernel reads key blocks past the end of k (NaN here; on a GPU not measured). A bug, left failing.
"""
import functools

import jax
from jax.experimental.pallas.ops.gpu import attention

ARRAY = "jax"
LAYOUT = "blhd"
DTYPES = ("float32", "float16", "bfloat16")
# mha raises ValueError for Dv != Dk and for a length past its block (128) that is not a multiple of it; it takes no
# mask. It is multi-head only: given fewer kv heads it reads other heads' keys, silently (no shape check).
SUPPORTS = {"value_head_dim": "same", "masks": ["none"], "gqa": False}


def supports(facts):
    if max(facts["Lq"], facts["Lk"]) > 128 and (facts["Lq"] % 128 or facts["Lk"] % 128):
        return "lengths past 128 must be multiples of mha's block (128)"


_mha = jax.jit(functools.partial(attention.mha, segment_ids=None, interpret=True),
               static_argnames=("sm_scale", "causal"))


def sdpa(q, k, v, is_causal=False, scale=None):
    return _mha(q, k, v, sm_scale=q.shape[-1] ** -0.5 if scale is None else float(scale), causal=is_causal)

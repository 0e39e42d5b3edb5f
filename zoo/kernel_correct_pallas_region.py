"""Correct: the flash stand-in (``kernel_correct``) behind the narrow region of JAX's Pallas GPU flash kernel.

``jax.experimental.pallas.ops.gpu.attention.mha`` runs head dims that are a multiple of 16, Dv = Dk,
sequence lengths that are a multiple of its block (128), and no mask. An implementation that declares
so little is judged on kernel-shaped cases only: this member shows that the covering set and the
per-property floor (conformance/covering.py, conformance/properties.py) judge such a region deeply
without a false alarm. Its broken twins (``kernel_broken_causal_past_last_key_block``,
``kernel_broken_gqa_kv_head_from_query_head``) have the two defects the suite found in Pallas-shaped
kernels.
"""
from zoo import kernel_correct as kernel

BUG = "none"
SOURCE = "zoo extra: the region of jax.experimental.pallas.ops.gpu.attention.mha (block 128, head dims % 16)"
EXPECTED_CLAUSES = frozenset()
# float16 is judged on the same flash stand-in under the flash region (kernel_correct); here float32 and bfloat16
# keep the self-check's battery of this member (every length a multiple of 128) within its per-test limit.
DTYPES = ("float32", "bfloat16")
SUPPORTS = {
    "head_dims": {"min": 16, "max": 256, "multiple": 16},
    "value_head_dim": "same",
    "lengths": {"multiple": 128, "max": 1024},
    "masks": ["none"],
    "causal": True,
    "gqa": True,
}
BLOCK = 128


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return kernel.flash_forward(q, k, v, mask, is_causal, scale)

"""Liger-Kernel's fused neighborhood attention (``liger_kernel.ops.fused_neighborhood_attention``), run on the CPU
by Triton's interpreter (TRITON_INTERPRET=1): each query attends the keys within kernel_size // 2 of its own
position, through its Triton forward and backward kernels: the contract's symmetric window (h, h) with
kernel_size 2h + 1, and every key (no window) with a kernel wider than the sequence.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported: kernels run on the CPU

from liger_kernel.ops.fused_neighborhood_attention import LigerFusedNeighborhoodAttentionFunction  # noqa: E402

ARRAY = "torch"
LAYOUT = "bhld"  # (B, H, L, D), the contract's own
DTYPES = ("float32", "float16")  # bfloat16: Triton's interpreter multiplies its bit patterns in tl.dot
# One length, as many kv heads as query heads, Dv == Dk (its output is empty_like(query)), never causal.
SUPPORTS = {"equal_lengths": True, "gqa": False, "value_head_dim": "same", "causal": False, "variants": ["window"]}


def sdpa(q, k, v, scale=None, *, window=None):
    if window is not None and window[0] != window[1]:
        raise NotImplementedError("a neighborhood is symmetric: window (h, h) only")
    half = q.shape[-2] if window is None or window[0] is None else window[0]
    return LigerFusedNeighborhoodAttentionFunction.apply(q, k, v, 2 * half + 1, 1, scale)

"""Broken: multi_head_attention whose heads' backward recomputes the weights without the window (ARRAY = "torch")."""
from zoo import broken_backward_window_forward_only as window_forward_only
from zoo import correct_torch_mha_variant_backward as base

BUG = ("each head's attention is right in the forward, but its backward recomputes P without the sliding window, so "
       "dquery, dkey, dvalue and every projection's gradient take gradient from keys the forward never attended.")
SOURCE = ("known bug class (window mask applied in forward but not backward, inside a multi-head layer): flash-style "
          "kernels recompute P in the backward and must repeat every masking of the forward (FlashAttention's "
          "apply_mask_local in flash_bwd_kernel.h)")
EXPECTED_CLAUSES = frozenset({"grad.mha-variants"})
ARRAY = "torch"
DTYPES = base.DTYPES


multi_head_attention = base.mha_of(window_forward_only.SDPA)  # BUG: the heads' backward forgets the window

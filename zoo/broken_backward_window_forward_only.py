"""Broken: correct forward with every variant, a backward that recomputes P without the window (ARRAY = "torch")."""
from zoo import correct_torch_variant_backward as base

BUG = ("the backward recomputes the weights without the sliding window (only the mask, the causal band, the chunk and "
       "the lengths), so dq, dk and dv take gradient from keys the forward never attended.")
SOURCE = ("known bug class (window mask applied in forward but not backward): flash-style kernels recompute P in the "
          "backward and must repeat every masking of the forward (FlashAttention's apply_mask_local in "
          "flash_bwd_kernel.h)")
EXPECTED_CLAUSES = frozenset({"grad.variants"})
ARRAY = "torch"
DTYPES = base.DTYPES


class SDPA(base.VariantSDPA):
    BACKWARD_KEEPS_WINDOW = False  # BUG: P recomputed without the window


sdpa = base.sdpa_of(SDPA)

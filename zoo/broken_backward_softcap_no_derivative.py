"""Broken: correct forward with every variant, a backward without softcap's derivative (ARRAY = "torch")."""
from zoo import correct_torch_variant_backward as base

BUG = ("the backward passes dS on to dq and dk as it is, without softcap's derivative 1 - tanh^2(s / c): right only "
       "where the cap is nearly linear (|s| much below c).")
SOURCE = ("known bug class (softcap's derivative omitted): a hand-written backward that recomputes P from the capped "
          "scores and forgets that the cap itself has a derivative; FlashAttention multiplies dS by dtanh "
          "(csrc/flash_attn/src/flash_bwd_kernel.h)")
EXPECTED_CLAUSES = frozenset({"grad.softcap"})
ARRAY = "torch"
DTYPES = base.DTYPES


class SDPA(base.VariantSDPA):
    SOFTCAP_DERIVATIVE = False  # BUG: dT = dS, the cap's derivative 1 - tanh^2 taken as 1


sdpa = base.sdpa_of(SDPA)

"""Broken: correct forward with every variant, the learnable sink's gradient of the wrong sign (ARRAY = "torch")."""
from zoo import correct_torch_variant_backward as base

BUG = ("the learnable sink's gradient is +sum_b sum_i P_sink (dO . O) instead of minus it: the sink moves the wrong "
       "way in training (raising sigma lowers every key's weight).")
SOURCE = ("known bug class (the sink's gradient of the wrong sign): d P_sink / d sigma = P_sink (1 - P_sink) > 0 is "
          "taken for the loss's derivative, whose chain through the keys' weights (each falls as sigma rises) carries "
          "the minus sign (FlashAttention 4: sink_sum += -sink_prob * dpsum)")
EXPECTED_CLAUSES = frozenset({"grad.learnable-sink"})
ARRAY = "torch"
DTYPES = base.DTYPES


class SDPA(base.VariantSDPA):
    SINK_SIGN = 1.0  # BUG: dsink = +sum P_sink r


sdpa = base.sdpa_of(SDPA)

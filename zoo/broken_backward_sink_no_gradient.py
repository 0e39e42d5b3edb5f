"""Broken: correct forward with every variant, no gradient for the learnable sink (ARRAY = "torch")."""
from zoo import correct_torch_variant_backward as base

BUG = ("the backward returns no gradient for the learnable sink (None, as if it were a constant like the ALiBi "
       "slopes): a trained sink never moves.")
SOURCE = ("known bug class (the sink's gradient not flowing): a custom backward written for q, k, v whose return tuple "
          "leaves the new input's slot None")
EXPECTED_CLAUSES = frozenset({"grad.learnable-sink"})
ARRAY = "torch"
DTYPES = base.DTYPES


class SDPA(base.VariantSDPA):
    SINK_GRADIENT = False  # BUG: dsink never returned


sdpa = base.sdpa_of(SDPA)

"""Broken: softmax normalises along axis -2 whatever axis it is given."""
from zoo import _reference as ref

BUG = ("softmax normalises along axis -2 (the query axis of a score matrix) instead "
       "of the requested axis (last by default).")
SOURCE = ("003_58636e0047490b73.txt, 'Scaled Dot-Product Attention': "
          "'if you do softscores = F.softmax(scores, dim=-2) you will mistakenly get ...'")
EXPECTED_CLAUSES = frozenset({"softmax.last-axis"})


def softmax(x, axis=-1):
    return ref.masked_softmax64(x, axis=-2).astype(ref.out_dtype(x))  # BUG: axis ignored, -2

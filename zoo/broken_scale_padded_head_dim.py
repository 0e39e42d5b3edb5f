"""Broken: the default scale is taken from the head dim padded to the kernel's tile of 64."""
import math

import numpy as np

from zoo import _reference as ref

BUG = "scale=None uses 1/sqrt(Dk rounded up to a multiple of 64) (the padded width the kernel allocates)."
SOURCE = "an independently written implementation; kernels pad head dims to 64/128 internally"
EXPECTED_CLAUSES = frozenset({"sdpa.scale-default", "sdpa.definition"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    if scale is None:
        dk = np.shape(q)[-1]
        scale = 1.0 / math.sqrt(-(-dk // 64) * 64)  # BUG: should be 1/sqrt(dk)
    return ref.sdpa(q, k, v, mask, is_causal, scale)

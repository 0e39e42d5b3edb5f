"""An sdpa that returns something other than an array: a list (no mask), None (a bool mask) or a
float (a float mask). Each is "returned <type>, expected an array of shape ..." (contract.result-type)."""
import numpy as np


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    out = np.zeros(q.shape[:-1] + (v.shape[-1],), q.dtype)
    if mask is None:
        return out.tolist()
    if mask.dtype == bool:
        return None
    return 0.0

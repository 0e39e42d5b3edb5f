"""An sdpa that breaks the contract in three ways, each contained to the cases it breaks."""
import numpy as np


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    if mask is not None:
        raise RuntimeError("masks are not handled")          # raises
    out = np.zeros(q.shape[:-1] + (v.shape[-1],), q.dtype)
    if is_causal:
        return out[..., :1, :]                                 # wrong shape
    if scale is not None:
        return np.full_like(out, np.nan)                       # NaN
    return out.astype(np.float64) if q.dtype == np.float32 else out   # wrong dtype

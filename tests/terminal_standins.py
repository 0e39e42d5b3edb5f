"""A NumPy stand-in for the plain torch sdpa wrapper (examples/torch_sdpa_wrapper.py) that fails the same way, for the
terminal's line budget (tests/test_repro.py) without torch's import and autodiff.

``TorchLikeWrapper`` is the zoo's float64 reference with torch 2.13's two behaviours that the wrapper meets (measured,
issue 24's closing note): a float mask together with is_causal raises the RuntimeError torch raises, and is_causal
with a negative scale gives NaN (torch's CPU math path fills the causal band with -inf before scaling, and a negative
scale turns it into +inf).
"""
from __future__ import annotations

import numpy as np

from zoo import _reference as ref


class TorchLikeWrapper:
    NAME = "torch_like_wrapper"
    DTYPES = ("float32", "float64")

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        if is_causal and mask is not None and np.asarray(mask).dtype != np.bool_:
            raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
        out = ref.sdpa(q, k, v, mask, is_causal, scale)
        if is_causal and scale is not None and scale < 0:
            out = np.full_like(out, np.nan)
        return out

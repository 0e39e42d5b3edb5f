"""An sdpa whose default scale is 1/sqrt(Dv) instead of 1/sqrt(Dk): wrong whenever Dv != Dk and
no scale is passed. Its failures are blamed on sdpa.scale-default, whichever property drew the case."""
from examples.my_attention import sdpa as correct_sdpa


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return correct_sdpa(q, k, v, mask, is_causal, v.shape[-1] ** -0.5 if scale is None else scale)  # BUG: Dv

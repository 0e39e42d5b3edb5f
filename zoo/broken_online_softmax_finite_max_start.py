"""Broken: an online softmax whose running maximum starts at a finite "minus infinity", -1e4."""
from zoo import correct_flash_blockwise as flash

BUG = ("the running maximum of the blockwise softmax starts at -1e4 instead of -inf: a row whose every score is "
       "below about -1e4 - 88 (a large finite additive mask on every key) underflows to a sum of 0 and returns zeros "
       "instead of its softmax-weighted values.")
SOURCE = "an independently written blockwise kernel (2026-11-25): 16-bit-minded kernels start m at -1e4 or -65504"
EXPECTED_CLAUSES = frozenset({"softmax.shift-invariance", "mask.float-additive"})
DTYPES = flash.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    return flash.tiled(q, k, v, mask, is_causal, scale, running_max_start=-1e4)  # BUG: not -inf

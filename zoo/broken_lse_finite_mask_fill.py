"""Broken: removed keys hold a large finite negative, so a row without keys has a finite lse (about -2.4e38)."""
import numpy as np

from zoo import _lse_member
from zoo import correct_sink_chunk_leftpad_reference as base

BUG = "removed keys score -0.7 * float32 max instead of -inf: a row without keys gets lse -0.7 * max + log(Lk), not -inf."
SOURCE = "jax.nn.dot_product_attention(return_residual=True), jax 0.10.2 on the CPU (measured 2026-11-28: -2.381976e+38)"
EXPECTED_CLAUSES = frozenset({"lse.fully-masked-row"})
DTYPES = _lse_member.DTYPES


def _lse(s, sink):
    fill = -0.7 * float(np.finfo(np.float32).max)
    return base.lse(np.where(np.isneginf(s), fill, s), sink)  # BUG: a finite fill


sdpa = _lse_member.sdpa_with_lse(_lse)

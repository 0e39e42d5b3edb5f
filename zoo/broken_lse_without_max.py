"""Broken: the lse forgets to add the row maximum back (log sum_j exp(s_j - m), the shifted sum's log)."""
import numpy as np

from zoo import _lse_member

BUG = "lse = log sum_j exp(s_j - m) without + m: right only where a row's largest score is 0."
SOURCE = "known bug class (the max shift of the online softmax not undone)"
EXPECTED_CLAUSES = frozenset({"lse.definition", "lse.variants", "lse.learnable-sink", "lse.varlen", "lse.paged"})
DTYPES = _lse_member.DTYPES


def _lse(s, sink):
    logits = s if sink is None else np.concatenate([s, np.broadcast_to(sink, s.shape[:-1] + (1,))], axis=-1)
    m = np.max(logits, axis=-1, keepdims=True)
    shift = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        total = np.log(np.sum(np.exp(logits - shift), axis=-1))
    return np.where(np.isfinite(m[..., 0]), total, -np.inf)  # BUG: + m dropped


sdpa = _lse_member.sdpa_with_lse(_lse)

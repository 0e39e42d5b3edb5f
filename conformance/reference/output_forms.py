"""The judge's form of outputs: sdpa_varlen's (total_q, Hq, Dv) held as (1, Hq, total_q, Dv) beside sdpa's
(B, Hq, L, D), so that the rows machinery (fully masked rows, their causes and policies) is shared.
"""
from __future__ import annotations

import numpy as np

# ------------------------------------------------------------ packed and paged batches
# sdpa_varlen and sdpa_paged are judged as the sdpa cases of their sequences (oracle.sequence_cases): each output
# row, its allowed error, whether it has a key and what emptied it are those of its sequence's sdpa case. The judge
# holds their results in one form with sdpa's (B, Hq, L, D), so that the rows machinery (fully masked rows, their
# causes and policies) is shared: sdpa_paged's output is that already; sdpa_varlen's (total_q, Hq, Dv) becomes
# (1, Hq, total_q, Dv), sequence b's rows at cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of axis 2.
SEQUENCE_OPS = ("sdpa_varlen", "sdpa_paged")


def assemble(op: str, pieces: list[np.ndarray]) -> np.ndarray:
    """Per-sequence (1, Hq, Lq_b, ...) arrays as one array of the judge's form: along the rows (sdpa_varlen) or the
    batch (sdpa_paged)."""
    return np.concatenate(pieces, axis=2 if op == "sdpa_varlen" else 0)


def canonical_output(op: str, array):
    """An output in the contract's form as the judge holds it: sdpa_varlen's (total_q, Hq, Dv) as
    (1, Hq, total_q, Dv); anything else (and an array of another rank, which the shape check names) unchanged."""
    if op != "sdpa_varlen" or np.ndim(array) != 3:
        return array
    return np.swapaxes(np.asarray(array), 0, 1)[None]


def contract_output(op: str, array):
    """The inverse of ``canonical_output``: (1, Hq, total_q, X) -> (total_q, Hq, X) for sdpa_varlen (rows: (1, Hq,
    total_q) -> (total_q, Hq))."""
    if op != "sdpa_varlen":
        return array
    return np.swapaxes(np.asarray(array)[0], 0, 1)


def contract_shape(op: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The contract's shape of an output the judge holds in ``shape``."""
    if op != "sdpa_varlen" or len(shape) != 4:
        return tuple(shape)
    return (shape[2], shape[1], shape[3])

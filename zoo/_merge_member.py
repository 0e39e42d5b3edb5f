"""What the merge_states members of the zoo share: a reference merge of P partial states (FlashInfer's
MergeStatesKernel in float32) whose steps a broken member replaces one at a time. Not a member itself (the leading
underscore)."""
from __future__ import annotations

import numpy as np

DTYPES = ("float64", "float32", "float16", "bfloat16")


def top(lse, sink):
    """(B, Hq, Lq) the largest part lse (and sink logit), 0 where every part is empty."""
    m = np.max(lse, axis=0)
    if sink is not None:
        m = np.maximum(m, sink)
    return np.where(np.isneginf(m), 0.0, m)


def weights(lse, m):
    """(P, B, Hq, Lq) each part's unnormalised weight exp(lse_p - m): 0 for a part without keys."""
    return np.exp(lse - m)


def sink_term(sink, m, parts: int):
    """The sink's term of the denominator, exp(sigma - m), counted once (0 without a sink)."""
    return 0.0 if sink is None else np.exp(sink - m)


def merged_lse(total, m):
    with np.errstate(divide="ignore"):
        return np.where(total > 0, m + np.log(np.where(total > 0, total, 1.0)), -np.inf)


STEPS = {"top": top, "weights": weights, "sink_term": sink_term, "merged_lse": merged_lse}


def merge(out, lse, learnable_sink=None, **steps):
    """(out, lse) of the merge; ``steps`` replaces a step of STEPS by name (a broken member's one change)."""
    step = {**STEPS, **steps}
    acc = np.float64 if out.dtype == np.float64 else np.float32
    parts_lse = np.asarray(lse, dtype=acc)
    sink = None if learnable_sink is None else np.asarray(learnable_sink, dtype=acc).reshape(1, -1, 1)
    m = step["top"](parts_lse, sink)
    with np.errstate(over="ignore", invalid="ignore"):
        w = step["weights"](parts_lse, m)
        total = np.sum(w, axis=0) + step["sink_term"](sink, m, out.shape[0])
        values = np.where(w[..., None] > 0, out.astype(acc), 0.0)
        merged = np.sum(w[..., None] * values, axis=0) / np.where(total > 0, total, 1.0)[..., None]
    merged = np.where((total > 0)[..., None], merged, 0.0)
    return merged.astype(out.dtype), step["merged_lse"](total, m).astype(acc)


def merge_states_with(**steps):
    """A merge_states whose STEPS are replaced by ``steps``."""

    def merge_states(out, lse, *, learnable_sink=None):
        return merge(out, lse, learnable_sink, **steps)

    return merge_states

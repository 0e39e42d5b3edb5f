"""Broken: GQA mapping wrong only for groups of 4 (a specialised kernel path tiles the kv heads)."""
import numpy as np

from zoo import _reference as ref

BUG = "for Hq / Hkv == 4 the kv heads are tiled (head h uses kv head h % Hkv); other group sizes are right."
SOURCE = "an independently written implementation: generated cases need a group of 4 to reach it"
EXPECTED_CLAUSES = frozenset({"sdpa.gqa-mapping"})


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    group = np.shape(q)[1] // np.shape(k)[1]
    if group == 4:
        k, v = np.tile(k, (1, group, 1, 1)), np.tile(v, (1, group, 1, 1))  # BUG: should repeat, not tile
    return ref.sdpa(q, k, v, mask, is_causal, scale)

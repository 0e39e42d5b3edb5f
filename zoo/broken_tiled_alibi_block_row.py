"""Broken: a tiled kernel measures ALiBi's distance from the row's index inside its 128-row query block."""
import numpy as np

from zoo import correct_flash_tiled_variants as tiled

BUG = ("query blocks of 128 rows; ALiBi's distance |p - j| takes p from the row's index inside its query block "
       "(plus query_offset) instead of its index in the sequence: exact for Lq <= 128, wrong from row 128 on.")
SOURCE = "hunt of stop 37 (held-out implementation): no corner had a query past row 128 with ALiBi"
EXPECTED_CLAUSES = frozenset({"sdpa.alibi"})
DTYPES = tiled.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None):
    return tiled.tiled(q, k, v, mask, is_causal, scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                       query_offset=query_offset, key_lengths=key_lengths, learnable_sink=learnable_sink,
                       alibi_rows=lambda first, last, offset: offset + np.arange(last + 1 - first))  # BUG

"""Broken: a tiled kernel measures ALiBi's distance from the row's index inside its 128-row query block."""
import numpy as np

from zoo import correct_flash_tiled_variants as tiled

BUG = ("query blocks of 128 rows; ALiBi's distance |p - j| takes p from the row's index inside its query block "
       "(plus query_offset) instead of its index in the sequence: exact for Lq <= 128, wrong from row 128 on.")
SOURCE = "an independently written tiled kernel (2026-11-25): only a query past row 128 with ALiBi reaches it"
EXPECTED_CLAUSES = frozenset({"sdpa.alibi"})
DTYPES = tiled.DTYPES


sdpa = tiled.with_hooks(alibi_rows=lambda first, last, offset: offset + np.arange(last + 1 - first))  # BUG

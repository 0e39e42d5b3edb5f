"""Broken: a causal tiled kernel's fast path for key blocks wholly below the band skips the explicit mask too."""
import numpy as np

from zoo import correct_flash_tiled_variants as tiled

BUG = ("query blocks of 128 rows, key blocks of 64; under is_causal a key block wholly below the causal band of a "
       "query block (every key at or before its first row) skips the causal test and, wrongly, the explicit mask: "
       "from row 128 on, masked keys of the first blocks are attended (a float mask's bias is dropped there).")
SOURCE = ("an independently written tiled kernel (2026-11-25): no query block has an interior key block before "
          "row 128, so corners of at most 128 rows pass it")
EXPECTED_CLAUSES = frozenset({"causal.top-left", "mask.bool-true-attends", "mask.float-additive"})
DTYPES = tiled.DTYPES


sdpa = tiled.with_hooks(interior_bias=np.zeros_like)  # BUG: the interior fast path drops the mask

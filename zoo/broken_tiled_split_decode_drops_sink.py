"""Broken: a split-KV decode path combines its splits without the learnable sink."""
import numpy as np

from zoo import correct_flash_tiled_variants as tiled

BUG = ("a decode call (Lq 1) against more than 128 keys runs split-KV and combines the splits' partials without "
       "the learnable sink (the prefill path and short caches add it): the sink is ignored exactly there.")
SOURCE = ("an independently written tiled kernel (2026-11-25): only a sink case of Lq 1 against more than 128 keys "
          "reaches it")
EXPECTED_CLAUSES = frozenset({"sdpa.learnable-sink"})
DTYPES = tiled.DTYPES


sdpa = tiled.with_hooks(sink_in_split_decode=np.zeros_like)  # BUG: the combine forgets the sink

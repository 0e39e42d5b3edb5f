"""Broken: a tiled kernel applies key_lengths in its last key block only."""
from zoo import correct_flash_tiled_variants as tiled

BUG = ("key blocks of 64; key_lengths masks keys j >= length only in the last key block, so where a sequence's "
       "length ends before the last block of 64 keys its padding keys in the earlier blocks are attended.")
SOURCE = "hunt of stop 37 (held-out implementation): caught in one of two default runs"
EXPECTED_CLAUSES = frozenset({"sdpa.varlen"})
DTYPES = tiled.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None, learnable_sink=None):
    return tiled.tiled(q, k, v, mask, is_causal, scale, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                       query_offset=query_offset, key_lengths=key_lengths, learnable_sink=learnable_sink,
                       lengths_in_block=lambda start, stop, lk: stop == lk)  # BUG: the last block only

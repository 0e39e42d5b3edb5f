"""Broken: a window whose left side passes every query position is dropped whole, its right edge with it.

FlashAttention takes window_size_left >= seqlen_k for unbounded (-1); TVM's libflash_attn then picked the kernel from
the caller's is_causal, so a sliding-window model passed as is_causal=False with window (W, 0) ran full attention on
prompts shorter than W ("This is why Mistral has been broken for short prompts").
"""
from zoo import correct_variants_reference as base

BUG = ("window (left, right) with left past every query position (left > query_offset + Lq - 1) is ignored: its "
       "right edge too, so without is_causal every key is attended.")
SOURCE = "tlc-pack/libflash_attn PR 11 (is_causal from the user's flag, not from window_size)"
EXPECTED_CLAUSES = frozenset({"sdpa.window", "sdpa.variant-order", "sdpa.query-offset"})
DTYPES = base.DTYPES


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, alibi_slopes=None,
         query_offset=0, query_lengths=None, key_lengths=None):
    if window is not None and window[0] is not None and window[0] > query_offset + q.shape[2] - 1:
        window = None  # BUG: the right side goes with the left
    return base.attend(q, k, v, mask, is_causal, scale, window, softcap, alibi_slopes, query_offset, query_lengths,
                       key_lengths)

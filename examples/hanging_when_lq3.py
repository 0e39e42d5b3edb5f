"""A correct sdpa that never returns when Lq == 3: only some shapes hang, and the first such
case cuts it (the call time limit), naming that case; its later calls fail at once."""
import time

from examples.my_attention import sdpa as correct_sdpa


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    if q.shape[-2] == 3:
        while True:
            time.sleep(1)
    return correct_sdpa(q, k, v, mask, is_causal, scale)

"""An sdpa that never returns: the suite must cut it with the per-test timeout and go on."""
import time


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    while True:
        time.sleep(1)

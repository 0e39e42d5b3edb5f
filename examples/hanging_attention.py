"""An sdpa that never returns: each call past the call time limit (--call-timeout, default 30 s)
fails its case as a hang, and the implementation's later calls fail at once ("hung earlier")."""
import time


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    while True:
        time.sleep(1)

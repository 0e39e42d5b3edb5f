"""A slow stand-in implementation for the self-checks of interruption and the per-test time limit.

examples/my_attention.py's NumPy sdpa, sleeping ``$SLOW_ATTENTION_DELAY_S`` seconds (default 0.05) per call;
with ``$SLOW_ATTENTION_WRONG=1`` it also leaves out the scale (every case with a scale other than 1 fails).
Run it as ``--impl tests.slow_attention`` from the repository root (tests/test_interrupted_run.py,
tests/test_time_limit.py).
"""
import os
import time

import numpy as np

DELAY_S = float(os.environ.get("SLOW_ATTENTION_DELAY_S", "0.05"))
WRONG = os.environ.get("SLOW_ATTENTION_WRONG") == "1"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    time.sleep(DELAY_S)
    g = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = q @ np.swapaxes(np.repeat(k, g, 1), -1, -2) * (1.0 if WRONG else scale)
    s = np.where(mask, s, -np.inf) if mask is not None and mask.dtype == bool else s + (0 if mask is None else mask)
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf) if is_causal else s
    w = np.exp(s - np.nan_to_num(s.max(-1, keepdims=True), neginf=0))
    w = w / np.where(w.sum(-1, keepdims=True) == 0, 1, w.sum(-1, keepdims=True))
    return (w @ np.repeat(v, g, 1)).astype(q.dtype)

"""NumPy stand-ins with narrow declared regions that log every call, for tests/test_region_and_coverage.py.

Each computes sdpa with the zoo's float64 reference (zoo/_reference.py) and refuses, by raising, any call
outside the region it declares (a call there would be the suite's fault: it must draw inside). Every call
appends a JSON line (stand-in, test id from PYTEST_CURRENT_TEST, Lq, Lk, mask dtype, is_causal, scale) to
the file named by $REGION_STANDIN_LOG, so the self-check counts calls per test against the cases judged.

- ``EqualLengths``: the Triton tutorial kernel's region, Lq == Lk (SUPPORTS equal_lengths);
- ``MasksNone``: no mask, causal only with Lq <= Lk, positive scales (SUPPORTS masks, causal, scale);
- ``EvenKeys``: a region only its supports(facts) knows: Lk even, more than one query head;
- ``KeyLengthsOnly``: key_lengths but no query_lengths in its signature (variant cases draw no query_lengths);
- ``NoMaskParameter``: no ``mask`` in its signature and no "masks" declared (fla's parallel_attn adapter).

Run them as ``--impl tests.region_standins:EqualLengths`` from the repository root.
"""
from __future__ import annotations

import json
import os

import numpy as np

from zoo import _reference as ref

LOG_VARIABLE = "REGION_STANDIN_LOG"


def _log(name: str, q, k, mask, is_causal, scale) -> None:
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    line = {"impl": name, "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0], "Lq": q.shape[-2],
            "Lk": k.shape[-2], "mask": None if mask is None else str(mask.dtype), "is_causal": bool(is_causal),
            "scale": scale}
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")


def _refuse_outside(name: str, why: str | None) -> None:
    if why:
        raise ValueError(f"{name} was called outside its declared region: {why}")


class EqualLengths:
    NAME = "standin_equal_lengths"
    DTYPES = ("float64",)
    SUPPORTS = {"equal_lengths": True}

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        _log(EqualLengths.NAME, q, k, mask, is_causal, scale)
        _refuse_outside(EqualLengths.NAME, q.shape[-2] != k.shape[-2] and f"Lq {q.shape[-2]} != Lk {k.shape[-2]}")
        return ref.sdpa(q, k, v, mask, is_causal, scale)


class MasksNone:
    NAME = "standin_masks_none"
    DTYPES = ("float64",)
    SUPPORTS = {"masks": ["none"], "causal": "lq<=lk", "scale": "positive"}

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        _log(MasksNone.NAME, q, k, mask, is_causal, scale)
        _refuse_outside(MasksNone.NAME, (mask is not None and "a mask")
                        or (is_causal and q.shape[-2] > k.shape[-2] and "causal with Lq > Lk")
                        or (scale is not None and scale <= 0 and f"scale {scale}"))
        return ref.sdpa(q, k, v, mask, is_causal, scale)


class NoMaskParameter:
    NAME = "standin_no_mask_parameter"
    DTYPES = ("float64",)

    @staticmethod
    def sdpa(q, k, v, is_causal=False, scale=None):
        _log(NoMaskParameter.NAME, q, k, None, is_causal, scale)
        return ref.sdpa(q, k, v, None, is_causal, scale)


class EvenKeys:
    NAME = "standin_even_keys"
    DTYPES = ("float64",)

    @staticmethod
    def supports(facts):
        if facts["Lk"] % 2:
            return f"Lk {facts['Lk']} is odd"
        if facts["Hq"] == 1:
            return "one query head"
        return None

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        _log(EvenKeys.NAME, q, k, mask, is_causal, scale)
        _refuse_outside(EvenKeys.NAME, EvenKeys.supports({"Lk": k.shape[-2], "Hq": q.shape[1]}))
        return ref.sdpa(q, k, v, mask, is_causal, scale)


class KeyLengthsOnly:
    NAME = "standin_key_lengths_only"
    DTYPES = ("float64",)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, key_lengths=None):
        _log(KeyLengthsOnly.NAME, q, k, mask, is_causal, scale)
        if key_lengths is not None:
            keep = np.arange(k.shape[-2])[None, :] < np.asarray(key_lengths)[:, None]  # (B, Lk)
            keep = keep[:, None, None, :]
            mask = keep if mask is None else (mask & keep if mask.dtype == np.bool_ else np.where(keep, mask, -np.inf))
        return ref.sdpa(q, k, v, mask, is_causal, scale)

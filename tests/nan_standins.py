"""Stand-in implementations that are right except that they return NaN, for tests/test_nan_never_passes.py.

Each NumPy stand-in is the zoo's float64 reference (zoo/_reference.py, the correct member
``correct_reference``) with NaN written into its result:

- ``NaNAlways``: every element of every result (softmax, sdpa, multi-head attention);
- ``NaNInOneRow``: one row of every result (the last query row of batch 0, head 0; for softmax the
  last slice along the axis);
- ``NaNWhenCausal``, ``NaNWhenMoreQueriesThanKeys``, ``NaNWhenMasked``: every element, only when the
  call meets the condition (is_causal=True; Lq > Lk; a mask given, or for softmax an input with -inf).

``TorchNaNGradient`` / ``TorchNaNGradientWhenCausal`` (ARRAY "torch") compute the forward right
(zoo/correct_torch.py) and give NaN in dL/dq, always or only when is_causal=True.

Every call that wrote a NaN where the contract specifies a value (all of these: no stand-in takes
query_lengths or declares FULLY_MASKED_ROWS "nan") appends a line "NAME<TAB>test id" to the file
named by $NAN_STANDIN_LOG, the test id taken from PYTEST_CURRENT_TEST: the self-check then asserts
that each of those tests failed. Run them as ``--impl tests.nan_standins:NaNAlways`` from the
repository root.
"""
from __future__ import annotations

import os

import numpy as np

from zoo import _reference as ref

LOG_VARIABLE = "NAN_STANDIN_LOG"


def note(name: str) -> None:
    """Log that the running test got a NaN where the contract specifies a value."""
    path = os.environ.get(LOG_VARIABLE)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    if path and test:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{name}\t{test}\n")


class NaNAlways:
    """NaN everywhere, on every call. ``poisoned`` decides when; ``poison`` writes the NaN."""

    NAME = "nan_always"
    DTYPES = ("float64",)  # the NaN is the same in every dtype; one keeps the self-check short

    @classmethod
    def poisoned(cls, op: str, mask=None, is_causal: bool = False, lq: int = 0, lk: int = 0, x=None) -> bool:
        return True

    @staticmethod
    def poison(out: np.ndarray, axis: int = -1) -> None:
        out[...] = np.nan

    @classmethod
    def _result(cls, out, op, axis=-1, **condition):
        if cls.poisoned(op, **condition):
            out = np.array(out)  # a writable copy
            cls.poison(out, axis)
            note(cls.NAME)
        return out

    @classmethod
    def softmax(cls, x, axis=-1):
        return cls._result(ref.softmax(x, axis), "softmax", axis, x=np.asarray(x))

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        return cls._result(ref.sdpa(q, k, v, mask, is_causal, scale), "sdpa", mask=mask, is_causal=is_causal,
                           lq=q.shape[-2], lk=k.shape[-2])

    @classmethod
    def multi_head_attention(cls, query, key, value, params, num_heads, mask=None, is_causal=False):
        out = ref.multi_head_attention(query, key, value, params, num_heads, mask, is_causal)
        return cls._result(out, "multi_head_attention", mask=mask, is_causal=is_causal, lq=query.shape[1],
                           lk=key.shape[1])


class NaNInOneRow(NaNAlways):
    NAME = "nan_in_one_row"

    @staticmethod
    def poison(out: np.ndarray, axis: int = -1) -> None:
        if out.ndim == 1:
            out[...] = np.nan
            return
        # A view whose last axis is the softmax's (the feature axis of sdpa and MHA): its last row of the first
        # batch (and head) is out[0, 0, -1, :] for sdpa (B, Hq, Lq, Dv), out[0, -1, :] for MHA (B, Lq, E).
        rows = np.moveaxis(out, axis, -1)
        rows[(0,) * (rows.ndim - 2) + (-1,)] = np.nan


class NaNWhenCausal(NaNAlways):
    NAME = "nan_when_causal"

    @classmethod
    def poisoned(cls, op, mask=None, is_causal=False, lq=0, lk=0, x=None) -> bool:
        return bool(is_causal)


class NaNWhenMoreQueriesThanKeys(NaNAlways):
    NAME = "nan_when_lq_above_lk"

    @classmethod
    def poisoned(cls, op, mask=None, is_causal=False, lq=0, lk=0, x=None) -> bool:
        return op != "softmax" and lq > lk


class NaNWhenMasked(NaNAlways):
    NAME = "nan_when_masked"

    @classmethod
    def poisoned(cls, op, mask=None, is_causal=False, lq=0, lk=0, x=None) -> bool:
        return bool(np.isneginf(x).any()) if op == "softmax" else mask is not None


# ------------------------------------------------------------------ gradients
class TorchNaNGradient:
    """sdpa with torch ops (zoo/correct_torch.py), right forward; its dL/dq is NaN when ``poisoned``."""

    NAME = "torch_nan_gradient"
    ARRAY = "torch"
    DTYPES = ("float64",)

    @classmethod
    def poisoned(cls, is_causal: bool) -> bool:
        return True

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        from zoo import correct_torch

        if cls.poisoned(is_causal) and q.requires_grad:
            q = _nan_gradient(cls.NAME).apply(q)
        return correct_torch.sdpa(q, k, v, mask, is_causal, scale)


class TorchNaNGradientWhenCausal(TorchNaNGradient):
    NAME = "torch_nan_gradient_when_causal"

    @classmethod
    def poisoned(cls, is_causal: bool) -> bool:
        return bool(is_causal)


def _nan_gradient(name: str):
    """An identity whose backward hands on NaN (and notes it): put on q, it makes dL/dq NaN."""
    import torch

    class NaNGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            note(name)
            return torch.full_like(grad, float("nan"))

    return NaNGradient

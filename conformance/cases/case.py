"""A Case: one call of one operation on concrete inputs, plus what it exercises.

Cases hold float64 masters; ``rounded(dtype)`` gives the inputs an implementation
receives. The oracle is always evaluated on those rounded inputs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from attention_conformance.implementations.arrays import is_eight_bit, numpy_dtype

ARRAY_INPUTS = ("x", "q", "k", "v", "mask", "query", "key", "value", "params", "alibi_slopes", "query_lengths",
                "key_lengths", "learnable_sink", "key_leftpad",
                # sdpa_varlen and sdpa_paged (docs/contract.md): offsets, used lengths, the caches and their table.
                "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "k_cache", "v_cache", "block_table")


# FP8 attention: the descale factors of 8-bit q, k, v, float32 (B, Hkv) whatever the 8-bit dtype.
DESCALES = ("q_descale", "k_descale", "v_descale")


ARRAY_INPUTS += DESCALES


# merge_states (docs/contract.md, "Merging partial states"): the stacked partial outputs and their lse.
MERGE_INPUTS = ("out", "lse")


ARRAY_INPUTS += MERGE_INPUTS


# The contract's form of these (docs/contract.md): ALiBi slopes, learnable sink logits and merged states' lse are float32
# (float64 in float64 cases), whatever the dtype of q; lengths and left paddings are int32. None is rounded to
# a 16-bit dtype.
SLOPES = "alibi_slopes"


FLOAT32_PARAMETERS = (SLOPES, "learnable_sink", *DESCALES, "lse")


LENGTHS = ("query_lengths", "key_lengths", "key_leftpad", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "block_table")


class Case:
    """op: one of the contract's operations (implementations/contract.py OPERATIONS); inputs: arrays (float64 or
    bool) and options
    (axis, scale, is_causal, num_heads); clauses: the first is named when values disagree;
    label: a readable id (the fixture id, or a summary of a generated case).

    A plain class, not a dataclass, so that Hypothesis prints the one-line repr in
    falsifying examples instead of every array.
    """

    def __init__(self, op: str, inputs: dict[str, Any], clauses: tuple[str, ...], label: str,
                 mask_kind: str = "none", notes: dict[str, Any] | None = None):
        self.op, self.inputs, self.clauses, self.label = op, inputs, tuple(clauses), label
        self.mask_kind, self.notes = mask_kind, dict(notes or {})

    def __repr__(self) -> str:
        return f"Case({self.op}: {self.label})"

    def _repr_pretty_(self, printer, cycle) -> None:  # Hypothesis's falsifying-example printer
        printer.text(repr(self))

    def rounded(self, dtype: str) -> dict[str, Any]:
        """Inputs as the implementation gets them: float arrays rounded to ``dtype``, booleans kept."""
        target = numpy_dtype(dtype)

        def cast(value, name=""):
            if isinstance(value, dict):
                return {key: cast(item) for key, item in value.items()}
            if name in LENGTHS and value is not None:
                return np.asarray(value).astype(np.int32)
            if name in FLOAT32_PARAMETERS and value is not None:
                return np.asarray(value).astype(np.float64 if dtype == "float64" else np.float32)
            if name == "mask" and is_eight_bit(dtype) and isinstance(value, np.ndarray) and value.dtype != np.bool_:
                return value.astype(np.float32)  # an 8-bit case's float mask: float32 (the 8-bit formats hold no -inf)
            if isinstance(value, np.ndarray) and value.dtype != np.bool_:
                # A -1e9 mask entry becomes -inf in float16, as the framework's own cast makes it.
                with np.errstate(over="ignore"):
                    return value.astype(target)
            return value

        return {name: cast(value, name) for name, value in self.inputs.items()}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        out = {}
        for name, value in self.inputs.items():
            if isinstance(value, np.ndarray):
                out[name] = value.shape
            elif isinstance(value, dict):
                out.update({f"{name}.{key}": item.shape for key, item in value.items()})
        return out

    def options(self) -> dict[str, Any]:
        return {k: v for k, v in self.inputs.items() if k not in ARRAY_INPUTS}

    def arrays(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in inputs.items() if k in ARRAY_INPUTS}


def widen(inputs: dict[str, Any]) -> dict[str, Any]:
    """Rounded inputs widened back to float64 (exact), for the oracle and the tolerance model."""

    def up(value):
        if isinstance(value, dict):
            return {key: up(item) for key, item in value.items()}
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":  # lengths stay integers
            if value.dtype != np.float64:
                return value.astype(np.float64)
            value = value.view()  # float64 already: not copied, and not writable through this view
            value.flags.writeable = False
        return value

    return {name: up(value) for name, value in inputs.items()}

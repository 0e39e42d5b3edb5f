"""Cross-backend agreement: every pair of implementation x device, per dtype, on the same cases.

Outputs of judged cases are kept (keyed by case label and dtype); at the end of the
run each pair that ran the same cases gets its max abs difference and max ULP
distance in that dtype.
"""
from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np

from attention_conformance.implementations.arrays import is_eight_bit, numpy_dtype

_OUTPUTS: dict[tuple[str, str], dict[str, np.ndarray]] = defaultdict(dict)  # (dtype, case) -> {impl@device: out}


_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


KEPT: list[tuple[tuple[str, str], str]] = []  # ((dtype, case), name) of each keep, in order (for transport.stream)


def keep(case_label: str, impl_name: str, device: str, dtype: str, output: np.ndarray) -> None:
    _OUTPUTS[(dtype, case_label)][f"{impl_name}@{device}"] = output
    KEPT.append(((dtype, case_label), f"{impl_name}@{device}"))


def _ordinal(values: np.ndarray, dtype: str) -> np.ndarray:
    """Map floats to unsigned integers in the same order, one step per representable value.

    Sign-magnitude bits become an offset binary: negatives count down from the
    midpoint, positives up from it, so the difference of two ordinals is their
    ULP distance (+0 and -0 coincide). Unsigned arithmetic cannot overflow here.
    """
    typed = np.asarray(values).astype(numpy_dtype(dtype))
    unsigned = _UINT[typed.dtype.itemsize]
    bits = typed.view(unsigned).astype(np.uint64)
    sign = np.uint64(1) << np.uint64(8 * typed.dtype.itemsize - 1)
    return np.where(bits & sign, sign - (bits & ~sign), sign + bits)


def ulp_distance(a: np.ndarray, b: np.ndarray, dtype: str) -> int:
    if is_eight_bit(dtype):  # an 8-bit case's output is 16-bit (FP8_OUTPUT_DTYPE): counted in bfloat16's steps
        dtype = "bfloat16"
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.any():
        return 0
    left, right = _ordinal(a[finite], dtype), _ordinal(b[finite], dtype)
    return int(np.max(np.maximum(left, right) - np.minimum(left, right)))


def matrix() -> list[dict]:
    """One row per (dtype, pair): cases compared, max abs difference, max ULP distance."""
    pairs: dict[tuple[str, str, str], dict] = {}
    for (dtype, _case), outputs in _OUTPUTS.items():
        for left, right in itertools.combinations(sorted(outputs), 2):
            a, b = outputs[left], outputs[right]
            if a.shape != b.shape:
                continue
            both = np.isfinite(a) & np.isfinite(b)
            diff = float(np.max(np.abs(a[both] - b[both]))) if both.any() else 0.0
            row = pairs.setdefault((dtype, left, right), {"dtype": dtype, "a": left, "b": right, "cases": 0,
                                                          "max_abs_diff": 0.0, "max_ulp": 0})
            row["cases"] += 1
            row["max_abs_diff"] = max(row["max_abs_diff"], diff)
            row["max_ulp"] = max(row["max_ulp"], ulp_distance(a, b, dtype))
    return sorted(pairs.values(), key=lambda r: (r["dtype"], r["a"], r["b"]))


def terminal_summary(tr) -> None:
    rows = matrix()
    if not rows:
        return
    tr.write_line("")
    tr.write_line("cross-backend agreement (max abs difference / max ULP distance over shared cases):")
    for dtype in sorted({r["dtype"] for r in rows}):
        tr.write_line(f"  {dtype}")
        for r in (r for r in rows if r["dtype"] == dtype):
            tr.write_line(f"    {r['a']:<22} vs {r['b']:<22} {r['max_abs_diff']:.2e} / {r['max_ulp']:>6} ulp  ({r['cases']} cases)")

"""The cross-backend agreement figures: ULP distances and the pairwise matrix."""
from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

from attention_conformance.conformance.judging import agreement
from attention_conformance.implementations.arrays import numpy_dtype

pytestmark = pytest.mark.selfcheck


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_ulp_distance_counts_representable_values(dtype):
    np_dtype = numpy_dtype(dtype)
    one = np.array([1.0], dtype=np_dtype)
    next_up = (one + ml_dtypes.finfo(np_dtype).eps).astype(np_dtype)  # the next representable value above 1
    tiny = np.array([ml_dtypes.finfo(np_dtype).smallest_subnormal], dtype=np_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # int64 overflow in float64 sign handling warned before
        assert agreement.ulp_distance(one, next_up, dtype) == 1
        assert agreement.ulp_distance(one, one, dtype) == 0
        assert agreement.ulp_distance(np.array([0.0]), np.array([-0.0]), dtype) == 0
        assert agreement.ulp_distance(tiny, -tiny, dtype) == 2
        big = np.array([ml_dtypes.finfo(np_dtype).max], dtype=np_dtype)
        assert agreement.ulp_distance(big, -big, dtype) > 0


def test_ulp_distance_in_the_dtype_not_in_float64():
    # 1 and 1 + 2**-7 are one bfloat16 step apart (7 stored mantissa bits) and 2**45 float64 steps.
    a, b = np.array([1.0]), np.array([1.0 + 2.0**-7])
    assert agreement.ulp_distance(a, b, "bfloat16") == 1
    assert agreement.ulp_distance(a, b, "float64") == 2**45


def test_matrix_pairs_implementations_on_shared_cases(monkeypatch):
    monkeypatch.setattr(agreement, "_OUTPUTS", agreement.defaultdict(dict))
    agreement.keep("case-1", "a", "cpu", "float32", np.array([1.0, 2.0]))
    agreement.keep("case-1", "b", "cpu", "float32", np.array([1.0, 2.5]))
    agreement.keep("case-2", "a", "cpu", "float32", np.array([0.0]))  # b did not run case-2
    (row,) = agreement.matrix()
    assert (row["a"], row["b"], row["cases"]) == ("a@cpu", "b@cpu", 1)
    assert row["max_abs_diff"] == 0.5
    assert row["max_ulp"] == 2**21  # 2 -> 2.5 in float32: a quarter of the 2**23 steps of [2, 4)

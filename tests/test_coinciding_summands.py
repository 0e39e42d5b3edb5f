"""The tolerance model's rule for coinciding summands (spec/tolerances.yaml, sdpa, coinciding_spread).

P @ V's rounding grows as sqrt(Lk) for varied summands and as Lk for summands p_ij v_jd that agree to within
coinciding_spread * Lk * u: flat weights with a value feature constant over the attended keys. A default run drew
such a case (test_masked_weights_sum_to_one, scale 0, Lk 2047) and failed torch_sdpa, a correct path, at 1.13x.
"""
from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest

from attention_conformance.conformance.reference import blocked as oracle_blocked
from attention_conformance.conformance.reference import oracle, tolerances
from zoo import broken_mask_after_softmax

pytestmark = pytest.mark.selfcheck


def sqrt_growth_only():
    """The model before the coinciding-summands rule: every sum grows as sqrt(Lk)."""
    return mock.patch.object(tolerances, "coinciding_spread", lambda: -1.0)

LK = 2047  # the drawn case's length


def sequential_sdpa(q, k, v, mask, scale):
    """A correct one-pass sdpa in q's dtype whose every sum is a running sum, one key after another (np.add.accumulate
    is sequential): the order in which coinciding summands' roundings add up the most."""
    dtype = q.dtype
    scores = np.where(mask, (q @ np.swapaxes(k, -1, -2)) * dtype.type(scale), -np.inf).astype(dtype)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p = (e / np.add.accumulate(e, axis=-1)[..., -1:]).astype(dtype)
    return np.add.accumulate(p[..., :, None] * v[..., None, :, :], axis=-2)[..., -1, :]


def drawn_case(rng, lk=LK, dtype=np.float32, kept=0.6):
    """One query row, v constant per feature (as test_masked_weights_sum_to_one builds it), a boolean mask."""
    q = rng.standard_normal((1, 1, 1, 64)).astype(dtype)
    k = rng.standard_normal((1, 1, lk, 64)).astype(dtype)
    v = np.broadcast_to(np.linspace(-1.5, 2.0, 64), (1, 1, lk, 64)).astype(dtype).copy()
    mask = rng.random((1, 1, 1, lk)) < kept
    mask[..., 0] = True
    return q, k, v, mask


def ratio(got, q, k, v, mask, scale, dtype="float32", policy="zeros"):
    exact = oracle.sdpa(q, k, v, mask, False, scale, fully_masked_rows_policy=policy)
    return float(np.max(np.abs(got - exact) / tolerances.sdpa_allowed(q, k, v, mask, False, scale, dtype, policy)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_running_sum_of_coinciding_summands_passes_and_failed_before_the_rule(dtype):
    q, k, v, mask = drawn_case(np.random.default_rng(0), dtype=np.dtype(dtype))
    got = sequential_sdpa(q, k, v, mask, 0.0)
    assert ratio(got, q, k, v, mask, 0.0, dtype) < 0.1
    with sqrt_growth_only():
        assert ratio(got, q, k, v, mask, 0.0, dtype) > 1.0  # the false alarm the rule mends


def test_torch_sdpa_on_the_drawn_case_passes():
    torch = pytest.importorskip("torch")
    q, k, v, mask = drawn_case(np.random.default_rng(0))
    got = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), attn_mask=torch.from_numpy(mask), scale=0.0).numpy()
    assert ratio(got, q, k, v, mask, 0.0) < 0.1


def test_a_mask_applied_after_the_softmax_is_still_rejected_on_the_drawn_case():
    q, k, v, mask = drawn_case(np.random.default_rng(0))
    got = broken_mask_after_softmax.sdpa(q, k, v, mask, scale=0.0)
    assert ratio(got, q, k, v, mask, 0.0) > 100


def test_varied_summands_keep_the_sqrt_growth():
    rng = np.random.default_rng(1)
    q, k, _, mask = drawn_case(rng)
    v_random = rng.standard_normal((1, 1, LK, 64)).astype(np.float32)
    _, _, v_constant, _ = drawn_case(rng)
    for v, scale in ((v_random, 0.0), (v_constant, None), (v_constant, 0.02)):  # flat weights or constant v alone
        weights = oracle.attention_weights(q, k, mask, False, scale)
        assert np.all(tolerances.accumulation_growth(weights, v.astype(np.float64), LK, 2.0**-24) == math.sqrt(LK))
        with sqrt_growth_only():
            before = tolerances.sdpa_allowed(q, k, v, mask, False, scale, "float32")
        assert np.array_equal(*np.broadcast_arrays(tolerances.sdpa_allowed(q, k, v, mask, False, scale, "float32"),
                                                   before))


def test_only_the_attended_keys_count_and_each_feature_is_decided_alone():
    rng = np.random.default_rng(2)
    lk, u = 300, 2.0**-24
    weights = np.zeros((1, 1, 2, lk))
    weights[0, 0, 0, ::2] = 1.0 / 150  # row 0 attends the even keys, row 1 every key
    weights[0, 0, 1] = 1.0 / lk
    v = rng.standard_normal((1, 1, lk, 3))
    v[0, 0, ::2, 0] = 0.5  # feature 0: constant over the even keys only
    v[0, 0, :, 1] = -2.0  # feature 1: constant over every key
    growth = tolerances.accumulation_growth(weights, v, lk, u)
    assert growth.shape == (1, 1, 2, 3)
    assert growth[0, 0, 0].tolist() == [lk, lk, math.sqrt(lk)]
    assert growth[0, 0, 1].tolist() == [math.sqrt(lk), lk, math.sqrt(lk)]


def test_query_heads_read_their_own_kv_head():
    lk = 64
    v = np.random.default_rng(3).standard_normal((1, 2, lk, 4))
    v[:, 0] = 1.25  # kv head 0 constant, kv head 1 varied
    growth = tolerances.accumulation_growth(np.full((1, 4, 1, lk), 1.0 / lk), v, lk, 2.0**-24)
    assert (growth[0, :2] == lk).all() and (growth[0, 2:] == math.sqrt(lk)).all()


def test_weights_rounded_to_a_16_bit_dtype_count_as_equal_within_two_of_its_roundings():
    lk, u_acc, u_bf16 = 100, 2.0**-24, 2.0**-8
    weights = np.linspace(1.0, 1.001, lk)[None, None, None] / lk  # a spread of 1e-3: > 16 Lk u_acc, < 2 u_bf16
    v = np.ones((1, 1, lk, 2))
    assert tolerances.accumulation_growth(weights, v, lk, u_acc) == math.sqrt(lk)
    assert (tolerances.accumulation_growth(weights, v, lk, u_acc, weights_rounding=u_bf16) == lk).all()


def test_a_fully_masked_uniform_row_of_constant_values_grows_as_lk_and_the_blocked_oracle_agrees():
    rng = np.random.default_rng(4)
    q, k, v, mask = drawn_case(rng, lk=512)
    q, mask = np.repeat(q, 3, axis=2), np.repeat(mask, 3, axis=2)
    mask[..., 1, :] = False  # row 1: fully masked, the mean of v under 'uniform'
    allowed = tolerances.sdpa_allowed(q, k, v, mask, False, 0.0, "float32", "uniform")
    with sqrt_growth_only():
        before = tolerances.sdpa_allowed(q, k, v, mask, False, 0.0, "float32", "uniform")
    assert np.all(allowed[..., 1, :] > 10 * before[..., 1, :])
    for block in (1, 2):
        _, blocked = oracle_blocked.sdpa_with_allowed(q, k, v, mask, False, 0.0, "float32", "uniform", block=block)
        np.testing.assert_allclose(blocked, allowed, rtol=1e-12)

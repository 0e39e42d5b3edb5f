"""Containment: a hang, a changed input, a result that is not an array, a class that cannot be
instantiated, each fails what it breaks with its own message; a fault is blamed on what it is."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from attention_conformance.conformance import test_dropout, test_fixtures, test_gradients, test_properties
from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.fixtures import fixtures
from attention_conformance.conformance.judging import containment, records, verdict
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.records import CaseRecord
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.implementations.registry import ImplementationLoadError, from_object, load_implementation

pytestmark = pytest.mark.selfcheck

LIMIT_S = 0.5  # the call time limit of these checks


@pytest.fixture
def short_limit(monkeypatch, kept_records):
    monkeypatch.setenv(containment.CALL_TIMEOUT_VARIABLE, str(LIMIT_S))


def sdpa_case(clauses=("sdpa.definition",), lq=3, lk=5, dk=4, dv=2, hq=1, hkv=1, label=None, seed=7, **options):
    rng = np.random.default_rng(seed)
    inputs = {"q": rng.standard_normal((1, hq, lq, dk)), "k": rng.standard_normal((1, hkv, lk, dk)),
              "v": rng.standard_normal((1, hkv, lk, dv)), **options}
    return Case("sdpa", inputs, clauses, label or f"Lq{lq} Lk{lk} Dk{dk} Dv{dv}")


def failure(judge: Judge, case: Case) -> ConformanceFailure:
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    return raised.value


# ------------------------------------------------------------------------------ hangs
def test_the_call_time_limit_default_and_setting(monkeypatch):
    monkeypatch.delenv(containment.CALL_TIMEOUT_VARIABLE, raising=False)
    assert containment.call_timeout_s() == containment.DEFAULT_CALL_TIMEOUT_S == 30.0
    monkeypatch.setenv(containment.CALL_TIMEOUT_VARIABLE, "2.5")
    assert containment.call_timeout_s() == 2.5
    for off in ("0", "off"):
        monkeypatch.setenv(containment.CALL_TIMEOUT_VARIABLE, off)
        assert containment.call_timeout_s() is None


def test_a_hang_fails_its_case_and_later_calls_fail_at_once(short_limit):
    impl = load_implementation("examples.hanging_attention")
    judge = Judge(impl, "float64", "cpu")
    started = time.monotonic()
    first = failure(judge, sdpa_case(label="the first case"))
    assert LIMIT_S <= time.monotonic() - started < LIMIT_S + 5
    assert first.clause == "contract.result-type"
    assert "hung" in str(first) and "timed out" in str(first) and "the first case" in str(first)
    assert impl.hung_on[0] == "the first case"
    started = time.monotonic()
    later = failure(judge, sdpa_case(lq=2, label="a later case"))
    assert time.monotonic() - started < LIMIT_S / 2  # not called again: no wait
    assert "hung earlier on case the first case" in str(later) and "a later case" in str(later)


class _SlowFirstCall:
    """A correct sdpa whose first call takes three call time limits (a loaded machine), later calls none."""

    ARRAY = "numpy"
    DTYPES = ("float64",)
    calls: list = []

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        from attention_conformance.conformance.reference import oracle

        cls.calls.append(q.shape)
        if len(cls.calls) == 1:
            time.sleep(3 * LIMIT_S)
        return oracle.sdpa(q, k, v, mask, is_causal, scale)


def test_a_slow_call_that_returns_ends_the_hang_at_the_next_test(short_limit, monkeypatch):
    """Only the slow case fails: its own test keeps the verdict (Hypothesis's replays see the same hang), a later
    test finds the call returned and calls again; a call that never returns keeps failing later tests at once."""

    running = {"test": "test A"}
    monkeypatch.setattr(containment, "running_test", lambda: running["test"])
    monkeypatch.setattr(_SlowFirstCall, "calls", [])
    impl = from_object(_SlowFirstCall, "slow_first", "tests:slow_first")
    judge = Judge(impl, "float64", "cpu")
    assert "the call hung: no result within" in str(failure(judge, sdpa_case(label="the slow case")))
    time.sleep(3 * LIMIT_S)  # the slow call has returned by now
    same_test = failure(judge, sdpa_case(lq=2, label="same test"))
    assert "hung earlier on case the slow case" in str(same_test) and len(_SlowFirstCall.calls) == 1
    running["test"] = "test B"
    got, _ = judge.check(sdpa_case(lq=2, label="a later test"))
    assert got.shape == (1, 1, 2, 2) and len(_SlowFirstCall.calls) == 2 and impl.hung_on is None

    hanging = load_implementation("examples.hanging_attention")
    hanging_judge = Judge(hanging, "float64", "cpu")
    failure(hanging_judge, sdpa_case(label="hangs"))
    running["test"] = "test C"
    started = time.monotonic()
    assert "hung earlier on case hangs" in str(failure(hanging_judge, sdpa_case(lq=2)))
    assert time.monotonic() - started < LIMIT_S / 2


THREAD_STATE = threading.local()  # as torch's grad mode or a JAX config context is: per thread


class _OracleSdpa:
    """The oracle's sdpa after ``during_call`` (each stand-in's own)."""

    ARRAY = "numpy"
    DTYPES = ("float64",)

    @classmethod
    def sdpa(cls, q, k, v, mask=None, is_causal=False, scale=None):
        from attention_conformance.conformance.reference import oracle

        cls.during_call()
        return oracle.sdpa(q, k, v, mask, is_causal, scale)


class LeavesThreadStateChanged(_OracleSdpa):
    threads: list = []

    @classmethod
    def during_call(cls):
        cls.threads.append(threading.current_thread())
        THREAD_STATE.changed = True  # never put back


class ReadsThreadState(_OracleSdpa):
    seen: list = []

    @classmethod
    def during_call(cls):
        cls.seen.append(getattr(THREAD_STATE, "changed", False))


def test_thread_state_a_call_leaves_changed_never_reaches_another_implementation(short_limit, monkeypatch):
    """Calls run in a long-lived thread of their implementation's own (containment.CallThread): what one
    implementation's call leaves changed in its thread reaches only its own later calls."""
    monkeypatch.setattr(LeavesThreadStateChanged, "threads", [])
    monkeypatch.setattr(ReadsThreadState, "seen", [])
    leaky = Judge(from_object(LeavesThreadStateChanged, "leaky", "tests:leaky"), "float64", "cpu")
    reader = Judge(from_object(ReadsThreadState, "reader", "tests:reader"), "float64", "cpu")
    for seed in range(3):
        leaky.check(sdpa_case(seed=seed))
        reader.check(sdpa_case(seed=seed))
    assert ReadsThreadState.seen == [False, False, False]
    assert not getattr(THREAD_STATE, "changed", False)  # nor the caller's thread
    assert len({id(t) for t in LeavesThreadStateChanged.threads}) == 1  # one thread for the implementation's calls


def test_a_correct_call_is_not_slowed_or_changed_by_the_limit(short_limit):
    judge = Judge(load_implementation("examples.my_attention"), "float64", "cpu")
    got, _ = judge.check(sdpa_case())
    assert got.shape == (1, 1, 3, 2)


def test_an_exception_of_the_implementation_still_names_its_line(short_limit):
    judge = Judge(load_implementation("examples.shape_and_nan_attention"), "float32", "cpu")
    message = str(failure(judge, sdpa_case(mask=np.ones((3, 5), bool))))
    assert "the implementation raised RuntimeError: masks are not handled" in message
    assert "shape_and_nan_attention.py:" in message


def test_a_property_does_not_shrink_into_a_hang(short_limit):
    """Hypothesis re-runs a failing example to shrink it: every re-run must fail at once."""
    impl = load_implementation("examples.hanging_attention")
    started = time.monotonic()
    with pytest.raises((ConformanceFailure, containment.HungEarlier)) as raised:
        test_properties.test_sdpa_matches_oracle(impl=impl, device="cpu", dtype="float64")
    elapsed = time.monotonic() - started
    assert "hung" in str(raised.value) and impl.hung_on is not None
    assert elapsed < LIMIT_S + 5, f"{elapsed:.1f} s: the property waited on the hang more than once, or shrank"
    # Once hung, a property stops at its first example: no shrinking, no explaining. Its first example is a
    # corner of the covering set, run outside Hypothesis, where the verdict is a plain failure (nothing shrinks
    # it); inside Hypothesis it is a HungEarlier.
    started = time.monotonic()
    with pytest.raises((ConformanceFailure, containment.HungEarlier), match="hung earlier on case"):
        test_properties.test_key_permutation(impl=impl, device="cpu", dtype="float64")
    assert time.monotonic() - started < 2


def test_an_implementation_that_hangs_for_one_shape_only(short_limit):
    impl = load_implementation("examples.hanging_when_lq3")
    judge = Judge(impl, "float64", "cpu")
    judge.check(sdpa_case(lq=2))  # correct where it returns
    message = str(failure(judge, sdpa_case(lq=3, label="three queries")))
    assert "hung" in message and "three queries" in message
    assert "hung earlier on case three queries" in str(failure(judge, sdpa_case(lq=2, label="two queries")))


def test_a_hang_in_a_fixture_is_cut(short_limit):
    impl = load_implementation("examples.hanging_attention")
    fx = next(f for f in fixtures() if f.op == "sdpa")
    with pytest.raises(ConformanceFailure, match=rf"(?s)hung.*{fx.id}|{fx.id}.*hung"):
        test_fixtures.test_fixture(fx, impl, "cpu", "float64")


class HangingDropout:
    NAME = "hanging_dropout"

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, dropout_p=0.0):
        while True:
            time.sleep(0.2)


def test_a_hang_in_the_dropout_tests_is_cut(short_limit):
    impl = from_object(HangingDropout, "hanging_dropout", "tests.test_containment:HangingDropout")
    started = time.monotonic()
    with pytest.raises((ConformanceFailure, containment.HungEarlier)) as raised:
        test_dropout.test_dropout_p_zero_is_no_dropout(impl=impl, device="cpu", dtype="float64")
    assert "hung" in str(raised.value) and time.monotonic() - started < LIMIT_S + 20


class HangingTorch:
    NAME = "hanging_torch"
    ARRAY = "torch"

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        while True:
            time.sleep(0.2)


def test_a_hang_in_the_gradient_tests_is_cut(short_limit):
    pytest.importorskip("torch")
    impl = from_object(HangingTorch, "hanging_torch", "tests.test_containment:HangingTorch")
    started = time.monotonic()
    with pytest.raises((ConformanceFailure, containment.HungEarlier)) as raised:
        test_gradients.test_sdpa_gradients(impl=impl, device="cpu", dtype="float64")
    assert "hung" in str(raised.value) and time.monotonic() - started < LIMIT_S + 20


# ---------------------------------------------------------------------- mutated inputs
def test_an_input_changed_in_place_is_its_own_violation(kept_records):
    judge = Judge(load_implementation("examples.mutating_attention"), "float64", "cpu")
    case = sdpa_case()
    inputs = case.rounded("float64")
    kept = inputs["q"].copy()
    with pytest.raises(ConformanceFailure) as raised:
        judge.run(case, inputs)
    assert raised.value.clause == "contract.inputs-unchanged"
    assert "mutated input q" in str(raised.value)
    assert np.array_equal(inputs["q"], kept)  # the judge's (and the oracle's) inputs are intact


class TorchScalesKInPlace:
    NAME = "torch_scales_k_in_place"
    ARRAY = "torch"
    DTYPES = ("float32", "bfloat16")

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        import torch

        k.mul_(0.5)  # in place, on the tensor the suite handed over
        return torch.nn.functional.scaled_dot_product_attention(q, k * 2, v, scale=scale)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # shared memory with the copy; a converted tensor
def test_a_framework_tensor_changed_in_place_is_seen(dtype, kept_records):
    pytest.importorskip("torch")
    impl = from_object(TorchScalesKInPlace, "t", "tests.test_containment:TorchScalesKInPlace")
    with pytest.raises(ConformanceFailure, match="mutated input k"):
        Judge(impl, dtype, "cpu").check(sdpa_case())


def test_mha_params_are_protected_too(kept_records):
    class ScalesWq:
        @staticmethod
        def multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False):
            params["w_q"] *= 2.0
            return np.zeros(query.shape[:2] + (params["w_o"].shape[1],), query.dtype)

    rng = np.random.default_rng(0)
    params = {"w_q": rng.standard_normal((4, 4)), "w_k": rng.standard_normal((4, 4)),
              "w_v": rng.standard_normal((4, 4)), "w_o": rng.standard_normal((4, 4))}
    case = Case("multi_head_attention", {"query": rng.standard_normal((1, 3, 4)), "key": rng.standard_normal((1, 3, 4)),
                                         "value": rng.standard_normal((1, 3, 4)), "params": params, "num_heads": 2},
                ("mha.projections",), "mha")
    judge = Judge(from_object(ScalesWq, "scales_wq", "x:ScalesWq"), "float64", "cpu")
    with pytest.raises(ConformanceFailure, match=r"mutated input params\.w_q"):
        judge.check(case)


# ------------------------------------------------------------------ the result's type
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mask, words", [
    (None, "returned list, expected an array of shape (1, 1, 3, 2)"),
    (np.ones((3, 5), bool), "returned None, expected an array of shape (1, 1, 3, 2)"),
    (np.zeros((3, 5)), "returned float, expected an array of shape (1, 1, 3, 2)"),
])
def test_a_result_that_is_not_an_array_is_named_before_any_conversion(mask, words, dtype, kept_records):
    judge = Judge(load_implementation("examples.wrong_result_types"), dtype, "cpu")
    found = failure(judge, sdpa_case(mask=mask) if mask is not None else sdpa_case())
    assert found.clause == "contract.result-type"
    assert words in str(found)


# ---------------------------------------------------------------------------- loading
def test_a_class_whose_constructor_needs_arguments_is_a_load_error():
    with pytest.raises(ImplementationLoadError) as raised:
        load_implementation("examples.needs_arguments:Attention")
    message = str(raised.value)
    assert "\n" not in message
    assert "cannot instantiate class Attention" in message and "causal_by_default" in message
    assert "pass an instance" in message and "examples.needs_arguments:instance" in message
    assert load_implementation("examples.needs_arguments:attention").implements("softmax")


def test_a_class_of_static_methods_still_works(kept_records):
    class Static:
        @staticmethod
        def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
            from examples.my_attention import sdpa

            return sdpa(q, k, v, mask, is_causal, scale)

    impl = from_object(Static, "static", "x:Static")
    Judge(impl, "float64", "cpu").check(sdpa_case())


# ------------------------------------------------------------------------ attribution
@pytest.mark.parametrize("spec, case, expected", [
    # A default scale from Dv, in a case drawn for the bool mask: the scale is at fault.
    ("examples.default_scale_from_dv", sdpa_case(("mask.bool-true-attends",), mask=np.tri(3, 5, dtype=bool)),
     "sdpa.scale-default"),
    # A causal off-by-one in a case drawn for large inputs: causal is at fault.
    ("zoo.broken_causal_plus_one", sdpa_case(("softmax.large-inputs", "sdpa.finite"), lq=4, lk=4, dv=4,
                                             is_causal=True), "causal.top-left"),
    # An output buffer like q (raises for Dv > Dk) in a case drawn for the mask: the value dim is at fault.
    ("zoo.broken_value_dim_like_q", sdpa_case(("mask.bool-true-attends",), dv=6, mask=np.tri(3, 5, dtype=bool)),
     "sdpa.value-dim"),
    # Grouped kv heads tiled instead of repeated, in a case drawn for the definition.
    ("zoo.broken_gqa_tile", sdpa_case(("sdpa.definition",), hq=4, hkv=2, dv=4), "sdpa.gqa-mapping"),
    # A fault no feature explains stays with the clause the case was drawn for.
    ("zoo.broken_sdpa_softmax_axis", sdpa_case(("mask.bool-true-attends",), mask=np.tri(3, 5, dtype=bool)),
     "mask.bool-true-attends"),
    # The feature the test is about is never taken out: causal in a causal case stays causal.
    ("zoo.broken_causal_plus_one", sdpa_case(("causal.top-left",), lq=4, lk=4, is_causal=True), "causal.top-left"),
])
def test_a_fault_is_blamed_on_the_feature_at_fault(spec, case, expected, kept_records):
    found = failure(Judge(load_implementation(spec), "float64", "cpu"), case)
    assert found.clause == expected, str(found)
    assert f"[{expected}]" in str(found)


class _SoftcapAfterAlibi:
    """The variants out of their order: softcap applied after the ALiBi bias (one head, no mask)."""

    DTYPES = ("float64",)

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, softcap=None, alibi_slopes=None):
        from zoo import correct_variants_reference as variants

        s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
        if alibi_slopes is not None:
            s = s + variants.alibi(alibi_slopes, q.shape[1], q.shape[2], k.shape[2], 0)
        if softcap is not None:
            s = softcap * np.tanh(s / softcap)
        w = np.exp(s - s.max(-1, keepdims=True))
        return (w / w.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("spec, expected", [
    # One keyword's fault in a case drawn for the order of the variants: the case passes without it alone.
    ("zoo.broken_variant_window_exclusive_right", "sdpa.window"),
    ("zoo.broken_variant_alibi_signed_distance", "sdpa.alibi"),
    # Two keywords out of order: the case passes without either, so the fault stays with the order.
    ("tests.test_containment:_SoftcapAfterAlibi", "sdpa.variant-order"),
])
def test_a_fault_in_a_case_drawn_for_the_variant_order_is_a_keywords_when_taking_it_out_alone_mends_it(
        spec, expected, kept_records):
    """The order's own probe takes every variant keyword out, which mends any one keyword's fault too: a window's
    right edge of 0 read as unbounded was filed as "where sdpa.variant-order and sdpa.window meet"."""
    case = sdpa_case(("sdpa.variant-order",), lq=4, lk=6, window=(2, 1), softcap=2.0, alibi_slopes=np.array([0.5]))
    if spec.startswith("tests."):
        case = sdpa_case(("sdpa.variant-order",), lq=4, lk=6, softcap=2.0, alibi_slopes=np.array([0.5]))
    found = failure(Judge(load_implementation(spec), "float64", "cpu"), case)
    assert found.clause == expected, str(found)


def test_a_correct_implementation_is_never_diagnosed(kept_records):
    judge = Judge(load_implementation("examples.my_attention"), "float64", "cpu")
    judge.check(sdpa_case(("softmax.large-inputs",), is_causal=True, mask=np.tri(3, 5, dtype=bool)))


def test_breaks_lead_with_the_clause_failed_on_the_smallest_case():
    def rec(clause, shape, status="failed"):
        return CaseRecord(test="t", implementation="impl", clause=clause, case="c", op="sdpa", dtype="float64",
                          device="cpu", status=status, shapes={"q": list(shape)})

    records = [rec("sdpa.definition", (2, 2, 8, 8)), rec("causal.top-left", (1, 1, 2, 2)),
               rec("causal.top-left", (1, 1, 4, 4)), rec("mask.broadcast", (1, 1, 1, 1), status="passed"),
               rec("softmax.large-inputs", (1, 1, 3, 3))]
    assert verdict.breaks_order(records) == {"impl": ["causal.top-left", "softmax.large-inputs", "sdpa.definition"]}


# ------------------------------------------------------------ non-finite results (sdpa.finite)
class NaNWhenCausal:
    """Right, except that a causal call returns NaN everywhere."""

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        from examples.my_attention import sdpa

        out = sdpa(q, k, v, mask, is_causal, scale)
        return np.full_like(out, np.nan) if is_causal else out


class NaNWhenCausalDeclared(NaNWhenCausal):
    KNOWN_DEVIATIONS = [{"clause": "sdpa.finite", "when": lambda facts: facts["is_causal"],
                         "reason": "NaN under is_causal (a known kernel bug)"}]


def test_a_non_finite_result_fails_at_the_call_before_any_property_compares_it(kept_records):
    """Judge.run refuses it: a property comparing the result with itself (NaN == NaN) never sees it."""
    judge = Judge(from_object(NaNWhenCausal, "nan_when_causal", "x:NaNWhenCausal"), "float64", "cpu")
    got, _ = judge.run(sdpa_case())  # not causal: a finite, right result
    assert np.isfinite(got).all()
    with pytest.raises(ConformanceFailure) as raised:
        judge.run(sdpa_case(("sdpa.key-permutation-invariance",), is_causal=True))
    message = str(raised.value)
    assert raised.value.clause == "sdpa.finite" and raised.value.record.status == "failed"
    assert "6 non-finite output element(s) where the oracle is finite" in message  # (1, 1, 3, 2), every element
    assert "index (0, 0, 0, 0): got nan, oracle" in message


def test_a_declared_sdpa_finite_deviation_still_applies_at_the_call(kept_records):
    judge = Judge(from_object(NaNWhenCausalDeclared, "declared", "x:NaNWhenCausalDeclared"), "float64", "cpu")
    with pytest.raises(pytest.xfail.Exception, match="declared deviation: sdpa.finite: NaN under is_causal"):
        judge.run(sdpa_case(is_causal=True))
    assert records.RECORDS[-1].status == "deviation" and records.RECORDS[-1].clause == "sdpa.finite"


def test_large_inputs_name_their_clause_at_the_call(kept_records):
    x = np.array([[800.0, 0.0, -3.0], [1.0, 2.0, 3.0]])
    judge = Judge(load_implementation("zoo.broken_softmax_no_max_sub"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.run(Case("softmax", {"x": x}, ("softmax.large-inputs",), "one row above exp's range"))
    assert raised.value.clause == "softmax.large-inputs"


def test_a_nan_in_a_fully_masked_row_breaks_the_fully_masked_row_clause_at_the_call(kept_records):
    """The same verdict judge() gives: the row breaks the declared (here the canonical 'zeros') policy."""
    class NaNFullyMaskedRows:
        @staticmethod
        def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
            from zoo import correct_nan_fully_masked

            return correct_nan_fully_masked.sdpa(q, k, v, mask, is_causal, scale)  # declares nothing: 'zeros'

    mask = np.ones((3, 5), bool)
    mask[1] = False
    judge = Judge(from_object(NaNFullyMaskedRows, "nan_rows", "x:NaNFullyMaskedRows"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.run(sdpa_case(("sdpa.key-permutation-invariance",), mask=mask))
    assert raised.value.clause == "mask.fully-masked-row"


def test_nan_where_the_contract_leaves_the_value_open_passes(kept_records):
    """A fully masked row under a declared 'nan' policy, and padding rows i >= query_lengths[b], may be NaN."""
    mask = np.ones((3, 5), bool)
    mask[1] = False
    judge = Judge(load_implementation("zoo.correct_nan_fully_masked"), "float64", "cpu")
    got, _ = judge.check(sdpa_case(mask=mask))
    assert np.isnan(got[0, 0, 1]).all() and np.isfinite(got[0, 0, [0, 2]]).all()

    class NaNPadding:
        @staticmethod
        def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, query_lengths=None, key_lengths=None):
            from attention_conformance.conformance.reference import oracle

            out = oracle.sdpa(q, k, v, mask, is_causal, scale, query_lengths=query_lengths, key_lengths=key_lengths)
            return np.where(oracle.judged_rows(q, query_lengths)[..., None], out, np.nan).astype(q.dtype)

    judge = Judge(from_object(NaNPadding, "nan_padding", "x:NaNPadding"), "float64", "cpu")
    got, _ = judge.check(sdpa_case(("sdpa.varlen",), query_lengths=np.array([2], np.int32)))
    assert np.isnan(got[0, 0, 2]).all() and np.isfinite(got[0, 0, :2]).all()


def test_the_large_shape_judge_refuses_nan_without_the_full_oracle(kept_records, monkeypatch):
    """It derives where a result must be finite from the rows (no (Lq, Lk) array)."""
    from attention_conformance.conformance.test_large_shapes import LargeShapeJudge, Shape, make_case

    def no_full_oracle(*args, **kwargs):
        raise AssertionError("the large-shape judge built the full oracle")

    monkeypatch.setattr(Judge, "_expected", no_full_oracle)
    impl = from_object(NaNWhenCausal, "nan_when_causal", "x:NaNWhenCausal")
    shape = Shape("tiny", 1, 2, 1, 5, 7, 4, "key-padding", True, ("sdpa.definition",))
    judge = LargeShapeJudge(impl, "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.run(make_case(shape))
    assert raised.value.clause == "sdpa.finite"
    assert "40 non-finite output element(s) where the oracle is finite" in str(raised.value)  # 1 * 2 * 5 * 4
    finite = make_case(Shape("tiny", 1, 2, 1, 5, 7, 4, "key-padding", False, ("sdpa.definition",)))
    got, inputs = judge.run(finite)
    judge.judge(finite, got, inputs)


# ------------------------------------------------------------------------ compiler refusals (REFUSALS)
TRITON_REFUSAL = ("No valid triton configs. OutOfMemoryError: out of resource: triton_tem_fused_flex_attention_backward"
                  "_mul_1 Required: 246784 Hardware limit:232448 Reducing block sizes or `num_stages` may help.")


def refusing_torch(where: str, refusals: tuple[str, ...]):
    """A torch sdpa (torch_math's) whose forward or backward raises Triton's shared-memory refusal, as torch_flex's
    backward did on an H200 at Dk 128, Dv 192 in float16; declaring ``refusals``."""
    import torch

    class Refused(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if where == "forward":
                raise RuntimeError(TRITON_REFUSAL)
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError(TRITON_REFUSAL)

    class RefusingTorch:
        NAME = "refusing_torch"
        ARRAY = "torch"
        REFUSALS = refusals

        @staticmethod
        def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                                   scale=scale)
            return Refused.apply(out)

    return from_object(RefusingTorch, "refusing_torch", "tests.test_containment:refusing_torch")


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_declared_compiler_refusal_is_unsupported_and_an_undeclared_one_fails(where, kept_records):
    """REFUSALS: an error whose text holds a declared sign is the compiler refusing the program (the case is
    unsupported, with the refusal as its reason), in the call and in its gradients; the same error undeclared, or
    another error, fails the case."""
    pytest.importorskip("torch")
    from attention_conformance.conformance.judging.gradient_verdicts import GradientJudge, judge_gradients

    case = sdpa_case(("grad.sdpa-q",))
    case.inputs["d_out"] = np.random.default_rng(8).standard_normal((1, 1, 3, 2))

    def verdict(refusals):
        judge = GradientJudge(refusing_torch(where, refusals), "float64", "cpu")
        judge_gradients(judge, case, case.rounded("float64"))

    with pytest.raises(pytest.skip.Exception, match="refusing_torch refused the program .*out of resource"):
        verdict(("out of resource",))
    assert records.RECORDS[-1].status == "unsupported" and "246784" in records.RECORDS[-1].message
    for refusals in ((), ("RESOURCE_EXHAUSTED",)):
        with pytest.raises(ConformanceFailure, match="out of resource"):
            verdict(refusals)


@pytest.mark.parametrize("refusals", ["out of resource", ("",), (3,)])
def test_refusals_must_be_a_tuple_of_texts(refusals):
    class Declared:
        REFUSALS = refusals

        @staticmethod
        def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
            return q

    with pytest.raises(ImplementationLoadError, match="REFUSALS must be a tuple of non-empty strings"):
        from_object(Declared, "declared", "x:Declared")


class RunsOutOfMemoryWithGroupedHeads:
    """Fits only with as many kv heads as query heads, as a kernel whose grouped variant asks more memory might: the
    repeated-kv probe then runs, which says nothing of the GQA mapping (an H100 run filed flex's "CUDA driver error:
    out of memory" at Dk 256 under sdpa.gqa-mapping so)."""

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        if q.shape[1] != k.shape[1]:
            raise RuntimeError("CUDA driver error: out of memory")
        from examples.my_attention import sdpa

        return sdpa(q, k, v, mask, is_causal, scale)


class RaisesWithGroupedHeads(RunsOutOfMemoryWithGroupedHeads):
    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        if q.shape[1] != k.shape[1]:
            raise ValueError("operands could not be broadcast together")
        return RunsOutOfMemoryWithGroupedHeads.sdpa(q, k, v, mask, is_causal, scale)


def test_a_resource_error_is_not_attributed_by_a_probe_that_fits(kept_records):
    case = sdpa_case(("sdpa.definition",), hq=4, hkv=2, dv=4)
    out_of_memory = from_object(RunsOutOfMemoryWithGroupedHeads, "oom", "tests:oom")
    found = failure(Judge(out_of_memory, "float64", "cpu"), case)
    assert found.clause == "sdpa.definition" and "out of memory" in str(found) and "fault is" not in str(found)
    other = failure(Judge(from_object(RaisesWithGroupedHeads, "raises", "tests:raises"), "float64", "cpu"), case)
    assert other.clause == "sdpa.gqa-mapping", str(other)  # any other exception is still attributed


def test_a_resource_error_in_the_gradients_is_not_attributed_either(kept_records):
    """The gradient tests' raised path (judging.fail with raised=True): the H100's flex at Dk 256, whose grouped case
    ran out of memory forward and backward, was filed under sdpa.gqa-mapping from a check of grad.gqa-sum."""
    torch = pytest.importorskip("torch")
    from attention_conformance.conformance.judging.gradient_verdicts import GradientJudge, judge_gradients

    class GroupedOutOfMemory:
        ARRAY = "torch"

        @staticmethod
        def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
            if q.shape[1] != k.shape[1]:
                raise RuntimeError("CUDA driver error: out of memory")
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                                    scale=scale)

    case = sdpa_case(("grad.gqa-sum",), hq=4, hkv=2, dv=4, mask=np.random.default_rng(9).standard_normal((3, 5)))
    case.inputs["d_out"] = np.random.default_rng(8).standard_normal((1, 4, 3, 4))
    judge = GradientJudge(from_object(GroupedOutOfMemory, "grouped_oom", "tests:grouped_oom"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge_gradients(judge, case, case.rounded("float64"))
    assert raised.value.clause == "grad.gqa-sum" and "out of memory" in str(raised.value)
    assert "fault is" not in str(raised.value)


def test_a_forward_of_the_wrong_shape_fails_its_shape_clause_in_the_gradient_tests(kept_records):
    """An independent torch sdpa read a rank-3 mask as (B, Lq, Lk) and grew the batch: the gradient tests filed
    autograd's "Mismatch in shape" under grad.sdpa-q. The forward alone is called when the gradients raise."""
    torch = pytest.importorskip("torch")
    from attention_conformance.conformance.judging.gradient_verdicts import GradientJudge, judge_gradients

    class BatchGrows:
        ARRAY = "torch"

        @staticmethod
        def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                                   scale=scale)
            return torch.cat([out, out]) if mask is not None and mask.dim() == 3 else out

    case = sdpa_case(("grad.sdpa-q",), hq=2, hkv=2, dv=4, mask=np.random.default_rng(9).standard_normal((2, 3, 5)))
    case.inputs["d_out"] = np.random.default_rng(8).standard_normal((1, 2, 3, 4))
    judge = GradientJudge(from_object(BatchGrows, "batch_grows", "tests:batch_grows"), "float64", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge_gradients(judge, case, case.rounded("float64"))
    assert raised.value.clause == "sdpa.output-shape" and "(2, 2, 3, 4)" in str(raised.value), str(raised.value)

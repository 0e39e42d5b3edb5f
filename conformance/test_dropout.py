"""Attention dropout, for implementations whose sdpa accepts ``dropout_p`` (clauses dropout.*).

Found with inspect.signature: an sdpa with a parameter named ``dropout_p`` (as
torch.nn.functional.scaled_dot_product_attention has) is tested here; any other
is skipped with the reason. Dropout acts on the attention weights after the
softmax (inverted dropout: kept weights are scaled by 1 / (1 - p)), so with
q = k = 0 every weight is 1 / Lk, and with v the identity (one-hot value rows,
Dv = Lk) output element (i, j) is the weight of key j in row i, 0 or
1 / (Lk (1 - p)). That makes each dropped weight visible as an exact 0.

The random stream is seeded from the drawn seed (torch.manual_seed inside
torch.random.fork_rng for ARRAY "torch", NumPy's global generator for "numpy",
restored afterwards), so a run is reproducible; JAX implementations handle their
own keys. The false-alarm probability of the rate check is in spec/tolerances.yaml
(section dropout).
"""
from __future__ import annotations

import contextlib
import inspect
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.drawing import keep_inside_region
from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.harness.checks import require_device
from attention_conformance.conformance.harness.properties import property_test
from attention_conformance.conformance.judging.containment import ImplementationHung
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import tolerances
from attention_conformance.implementations.arrays import ARRAY_KINDS
from attention_conformance.implementations.contract import missing_keywords_message

pytestmark = [pytest.mark.conformance, pytest.mark.op("sdpa")]

# p in [0.1, 0.9]: a missing 1/(1-p) is then >= 11 % off, far outside the scaling tolerance in every dtype.
DROPOUT_PROBABILITIES = st.sampled_from([0.1, 0.25, 0.5, 0.75]) | st.floats(0.1, 0.9)
# Rate cases: B * H * Lq * Lk weights, at least 2 * 2 * 64 * 64 = 16384 of them, so that the
# Hoeffding half-width at the spec's false-alarm probability (1e-6) is at most 0.021.
RATE_MIN_BATCH_HEADS = 2
RATE_MIN_LEN = 64
RATE_MAX_LEN = 128


def dropout_section() -> dict:
    return tolerances.model()["dropout"]


def has_dropout(impl) -> bool:
    fn = impl.operation("sdpa")
    try:
        return fn is not None and "dropout_p" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _without_dropout(impl) -> str | None:
    return None if has_dropout(impl) else missing_keywords_message(impl.name, "sdpa", ["dropout_p"])


@contextlib.contextmanager
def seeded(array: str, device: str, seed: int):
    """Seed the framework's global random stream for one call, restoring it afterwards."""
    if array == "torch":
        import torch

        devices = [torch.cuda.current_device()] if device == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield
    elif array == "numpy":
        state = np.random.get_state()
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            np.random.set_state(state)
    else:
        yield


def call_with_dropout(impl, inputs: dict, device: str, dropout_p: float, seed: int) -> np.ndarray:
    """impl.obj.sdpa(q, k, v, [mask, is_causal, scale,] dropout_p=dropout_p), NumPy result.

    q, k, v are handed in the implementation's LAYOUT and the result comes back in it (the judge's contract check
    transposes it to (B, H, L, D)).
    """
    kind = ARRAY_KINDS[impl.array]
    args = [kind.to_native(impl.to_layout("sdpa", name, inputs[name]), device) for name in ("q", "k", "v")]
    kwargs = {"dropout_p": dropout_p}
    if inputs.get("mask") is not None:
        kwargs["mask"] = kind.to_native(inputs["mask"], device)
    if inputs.get("is_causal"):
        kwargs["is_causal"] = True
    if inputs.get("scale") is not None:
        kwargs["scale"] = inputs["scale"]
    with seeded(impl.array, device, seed), kind.precision(inputs):  # JAX: x64 for a float64 case only
        return kind.to_numpy(impl.obj.sdpa(*args, **kwargs))


class DropoutJudge(Judge):
    """A Judge whose repro snippet calls sdpa with dropout_p (and the seed) again."""

    def _snippet(self, case: Case, inputs: dict, arrays_file: str | None = None) -> str:
        notes = case.notes
        if "dropout_p" not in notes:
            return super()._snippet(case, inputs, arrays_file)
        b, h, lq, lk = notes["shape"]
        return "\n".join([
            "import numpy as np, ml_dtypes",
            "from attention_conformance.implementations.registry import load_implementation",
            "from attention_conformance.implementations.arrays import numpy_dtype",
            "from attention_conformance.conformance.test_dropout import call_with_dropout",
            f"impl = load_implementation({self.impl.spec!r})",
            f"dt = numpy_dtype({self.dtype!r})",
            f"q = np.zeros(({b}, {h}, {lq}, 4), dt); k = np.zeros(({b}, {h}, {lk}, 4), dt)",
            f"v = np.broadcast_to(np.eye({lk}), ({b}, {h}, {lk}, {lk})).astype(dt)",
            f"out = call_with_dropout(impl, {{'q': q, 'k': k, 'v': v}}, {self.device!r}, "
            f"{notes['dropout_p']!r}, seed={notes['seed']!r}).astype(np.float64)",
            f"print('dropped fraction', np.mean(out == 0), 'kept values', np.unique(out[out != 0])[:5], "
            f"'expected', 1 / ({lk} * (1 - {notes['dropout_p']!r})))",
        ])


def judge_for(impl, device, dtype) -> DropoutJudge:
    require_device(impl, device)
    return DropoutJudge(impl, dtype, device)


@st.composite
def uniform_one_hot_cases(draw, *, min_batch_heads: int = 1, min_len: int = 1, max_len: int = 16,
                          clauses=("dropout.scaling",)) -> Case:
    """q = k = 0 (uniform weights 1/Lk), v = identity (B, H, Lk, Lk): output (i, j) is row i's weight of key j."""
    b = draw(st.integers(min_batch_heads, 2), label="B")
    h = draw(st.integers(min_batch_heads, 2), label="H")
    lq = draw(st.integers(min_len, max_len), label="Lq")
    lk = draw(st.integers(min_len, max_len), label="Lk")
    p = draw(DROPOUT_PROBABILITIES, label="dropout_p")
    seed = draw(st.integers(0, 2**31 - 1), label="dropout seed")
    inputs = {
        "q": np.zeros((b, h, lq, 4)),
        "k": np.zeros((b, h, lk, 4)),
        "v": np.broadcast_to(np.eye(lk), (b, h, lk, lk)).copy(),
    }
    label = f"B{b} H{h} Lq{lq} Lk{lk} q=k=0 v=identity dropout_p={p:.6g} seed={seed}"
    case = Case("sdpa", inputs, clauses, label, notes={"dropout_p": p, "seed": seed, "shape": (b, h, lq, lk)})
    keep_inside_region(draw, case)  # drawn outside sdpa_cases: a shape the region refuses is filtered, not called
    return case


def _run(judge: DropoutJudge, case: Case, inputs: dict, dropout_p: float, seed: int) -> np.ndarray:
    """Call with dropout; unsupported cases are rejected, exceptions and wrong shapes fail case.clauses[0]."""
    __tracebackhide__ = True
    impl = judge.impl
    judge.require_support(case, inputs, "sdpa")
    raised = None
    try:
        got = judge.limited(case, call_with_dropout, impl, inputs, judge.device, dropout_p, seed)
    except ImplementationHung as exc:  # past the call time limit (conformance/judging/verdict.py)
        judge.hung(case, inputs, exc)
    except NotImplementedError as exc:
        judge.not_implemented(case, exc)
    except Exception as exc:  # contained: this case fails, the session goes on
        raised = f"sdpa(..., dropout_p={dropout_p}) raised {type(exc).__name__}: {exc}"
    if raised:
        judge.fail(case.clauses[0], case, inputs, raised)
    return judge._check_contract(case, inputs, got)


# ----------------------------------------------------------------------- tests
@property_test(covering_set="brief", requires=_without_dropout)
@given(case=sdpa_cases(clauses=("dropout.p-zero",)))
def test_dropout_p_zero_is_no_dropout(impl, device, dtype, case):
    """dropout_p=0.0 gives sdpa without dropout: the oracle, within the sdpa tolerance."""
    judge = judge_for(impl, device, dtype)
    inputs = case.rounded(dtype)
    got = _run(judge, case, inputs, 0.0, seed=0)
    judge.judge(case, got, inputs, "dropout.p-zero")


@property_test(covering_set="brief", requires=_without_dropout)
@given(case=uniform_one_hot_cases())
def test_dropout_scales_kept_weights(impl, device, dtype, case):
    """Every output element is 0 (dropped) or 1 / (Lk (1 - p)) (kept and rescaled), within rounding."""
    judge = judge_for(impl, device, dtype)
    inputs = case.rounded(dtype)
    p, seed = case.notes["dropout_p"], case.notes["seed"]
    got = _run(judge, case, inputs, p, seed)
    lk = inputs["k"].shape[-2]
    kept = 1.0 / (lk * (1.0 - p))
    u = tolerances.unit_roundoff(dtype)
    c_value = float(dropout_section()["c_value"]) * float(tolerances.model()["safety_factor"])
    allowed = c_value * u * kept
    off = np.minimum(np.abs(got), np.abs(got - kept))
    if np.any(~np.isfinite(got)) or off.max() > allowed:
        bad = ~np.isfinite(got) | (off > allowed)
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        values = np.unique(got[np.isfinite(got) & (got != 0)])
        judge.fail(
            "dropout.scaling", case, inputs,
            f"{int(bad.sum())} of {got.size} weights are neither 0 (dropped) nor 1/(Lk(1-p)) = {kept:.9g} "
            f"(kept and rescaled) within {allowed:.3e}; kept values seen: {values[:4].tolist()}"
            + (" (= 1/Lk, not rescaled)" if values.size and abs(values[0] - 1.0 / lk) <= allowed else ""),
            f"index {index}: got {got[index]:.9g}",
        )
    judge.record(case, "dropout.scaling", "passed", max_abs_error=float(off.max()), allowed=allowed)


def hoeffding_half_width(n: int, false_alarm: float) -> float:
    """t with P(|dropped/n - p| >= t) <= 2 exp(-2 n t^2) = false_alarm."""
    return math.sqrt(math.log(2.0 / false_alarm) / (2.0 * n))


@property_test(covering_set="brief", requires=_without_dropout)
@given(case=uniform_one_hot_cases(min_batch_heads=RATE_MIN_BATCH_HEADS, min_len=RATE_MIN_LEN, max_len=RATE_MAX_LEN,
                                  clauses=("dropout.rate",)))
def test_dropout_rate(impl, device, dtype, case):
    """The dropped fraction of B*H*Lq*Lk weights lies within the Hoeffding bound around dropout_p."""
    judge = judge_for(impl, device, dtype)
    inputs = case.rounded(dtype)
    p, seed = case.notes["dropout_p"], case.notes["seed"]
    got = _run(judge, case, inputs, p, seed)
    n = got.size
    dropped = float(np.mean(got == 0))
    false_alarm = float(dropout_section()["false_alarm"])
    half_width = hoeffding_half_width(n, false_alarm)
    if abs(dropped - p) > half_width:
        judge.fail(
            "dropout.rate", case, inputs,
            f"dropped fraction {dropped:.4f} of {n} weights, expected dropout_p = {p:.4g} +- {half_width:.4f} "
            f"(Hoeffding, false-alarm probability {false_alarm:g})",
            f"{int(round(dropped * n))} exact zeros among {n} weights",
        )
    _check_independence(judge, case, inputs, got == 0, p, false_alarm)
    judge.record(case, "dropout.rate", "passed", max_abs_error=abs(dropped - p), allowed=half_width)


def _check_independence(judge, case, inputs, dropped: np.ndarray, p: float, false_alarm: float) -> None:
    """Independent drops: every key and query position at rate p, and no two (batch, head) slices alike.

    A fixed pattern (the first keys of every row, say) has the right overall rate;
    its positions do not. The false-alarm budget is split over the Lq + Lk position
    checks (union bound), each a Hoeffding bound over its B*H*L weights.
    """
    __tracebackhide__ = True
    b, h, lq, lk = dropped.shape
    for axis, name, per in ((-1, "query", b * h * lk), (-2, "key", b * h * lq)):
        rates = dropped.mean(axis=(0, 1, axis))
        half_width = hoeffding_half_width(per, false_alarm / (lq + lk))
        worst = int(np.argmax(np.abs(rates - p)))
        if abs(rates[worst] - p) > half_width:
            judge.fail(
                "dropout.rate", case, inputs,
                f"{name} position {worst} has dropped fraction {rates[worst]:.4f} of {per} weights, expected "
                f"dropout_p = {p:.4g} +- {half_width:.4f}: drops depend on the position, not independent",
                f"dropped fraction per {name} position: {np.round(rates, 3).tolist()[:16]}",
            )
    slices = dropped.reshape(b * h, lq * lk)
    alike = [i for i in range(1, b * h) if np.array_equal(slices[i], slices[0])]
    if alike:
        judge.fail(
            "dropout.rate", case, inputs,
            f"(batch, head) slices {alike} drop exactly the weights slice 0 drops ({lq * lk} weights each): "
            f"the drops are shared, not independent",
        )

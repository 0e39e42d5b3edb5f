"""FULLY_MASKED_ROWS by cause, by dtype and as a callable: each fully masked row judged by its own cause's policy.

Stand-ins (NumPy, computed in float64 and cast back) implement real conventions for rows without a key:
FlashAttention's reference (a row its window empties is zeroed, a bias -inf on every key gives NaN) and HF eager
attention's dtype split (NaN in float16, the mean of v otherwise). Each passes the suite when it declares what it
does and fails mask.fully-masked-row when it does not; the older forms keep their verdicts.
"""
from __future__ import annotations

import types

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.expected import fully_masked_causes
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.implementations import deviations
from attention_conformance.implementations.registry import ImplementationLoadError, from_object, load_implementation

from .attention_parts import attention_parts as _attention_parts
from .battery import run_battery

pytestmark = pytest.mark.selfcheck
SPEC = "tests.test_fully_masked_rows"


# ------------------------------------------------------------------ stand-ins
def _plain_softmax(s: np.ndarray) -> np.ndarray:
    """exp(s - max) / sum: an all -inf row is NaN (0/0), as torch.softmax gives."""
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


class WindowZerosBiasNan:
    """FlashAttention's reference convention: -inf masking and a plain softmax (a row of -inf is NaN), then the
    rows the window alone empties are zeroed (attention_ref: attention.masked_fill(all(local_mask), 0))."""

    FULLY_MASKED_ROWS = {"window": "zeros", "float": "nan", "bool": "nan"}

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, query_offset=0):
        s, keep, v64, window_rows = _attention_parts(q, k, v, mask, is_causal, scale, window, query_offset)
        weights = _plain_softmax(np.where(keep, s, -np.inf))
        weights = np.where(window_rows[..., None], 0.0, weights)
        return (weights @ v64).astype(np.asarray(q).dtype)


class WindowZerosBiasNanUndeclared(WindowZerosBiasNan):
    FULLY_MASKED_ROWS = "nan"  # the window rows are zeros


class NanInFloat16:
    """HF eager attention's split: a masked row averages v (a large finite negative fill) in float32, but in
    float16 every masked score is -inf (the additive finfo(float16).min overflowed) and the row is NaN."""

    DTYPES = ("float16", "float32")
    FULLY_MASKED_ROWS = {"float16": "nan", "float32": "uniform"}

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        s, keep, v64, _ = _attention_parts(q, k, v, mask, is_causal, scale)
        keep &= ~np.isneginf(s)
        fill = -np.inf if np.asarray(q).dtype == np.float16 else -0.7 * np.finfo(np.float64).max
        return (_plain_softmax(np.where(keep, s, fill)) @ v64).astype(np.asarray(q).dtype)


class NanInFloat16Undeclared(NanInFloat16):
    FULLY_MASKED_ROWS = "uniform"


class NanInFloat16Callable(NanInFloat16):
    SEEN: list = []

    @staticmethod
    def FULLY_MASKED_ROWS(facts):  # noqa: N802 -- the contract's attribute name
        NanInFloat16Callable.SEEN.append(dict(facts))
        return "nan" if facts["dtype"] == "float16" else "uniform"


# ------------------------------------------------------------------ cases
def _case(lq=6, lk=3, **options) -> Case:
    rng = np.random.default_rng(11)
    inputs = {"q": rng.standard_normal((2, 2, lq, 4)), "k": rng.standard_normal((2, 1, lk, 4)),
              "v": rng.standard_normal((2, 1, lk, 3)), **options}
    return Case("sdpa", inputs, ("mask.fully-masked-row",), "crafted", mask_kind="crafted")


def _window_and_bias_case() -> Case:
    """Rows 3-5 emptied by window (0, 0) (six queries, three keys); row 0 of every head by a float mask -inf on
    every key: two causes, two policies in one case."""
    bias = np.zeros((6, 3))
    bias[0] = -np.inf
    return _case(window=(0, 0), mask=bias)


def _judge(spec: str, dtype: str = "float32") -> Judge:
    return Judge(load_implementation(spec), dtype, "cpu")


# ------------------------------------------------------------------ attribution of causes
@pytest.mark.parametrize("options, expected", [
    # Each cause alone; the first in the order key_lengths, window, causal, attention_chunk, key_leftpad, bool,
    # float wins where several do.
    ({"window": (0, 0)}, {3: "window", 4: "window", 5: "window"}),
    ({"key_lengths": np.array([0, 3])}, {i: "key_lengths" for i in range(6)}),  # example 0 only
    ({"window": (0, 0), "key_lengths": np.array([0, 3])}, {0: "key_lengths", 3: "key_lengths"}),
    ({"mask": np.array([[True] * 3] * 5 + [[False] * 3]), "window": (0, 0)}, {5: "window", 4: "window"}),
    ({"mask": np.where(np.arange(6)[:, None] == 1, -np.inf, np.zeros((6, 3)))}, {1: "float"}),
    # Only together: a boolean mask keeping only keys the causal band removes -> the mask kind of the case.
    ({"mask": np.triu(np.ones((6, 3), dtype=bool), 1), "is_causal": True}, {0: "bool", 2: "bool"}),
    # A float mask -inf on the one key the window keeps: float + window together -> "float" (the case's kind).
    ({"mask": np.where(np.eye(6, 3, dtype=bool), -np.inf, 0.0), "window": (0, 0)}, {0: "float", 2: "float",
                                                                                    3: "window"}),
    # Window and key lengths together, no mask -> "bool"; rows past the last key are the window's alone.
    ({"window": (0, 0), "key_lengths": np.array([1, 3])}, {1: "bool", 2: "bool", 3: "window"}),
    # A chunk alone: queries at positions 4..6 lie in chunks without keys (keys 0..2, chunks of 2), beside a bool
    # mask's own row; with the window it bounds: its sink token (key 0) and the query's chunk (key 2) share no key.
    ({"attention_chunk": 2, "query_offset": 1}, {3: "attention_chunk", 5: "attention_chunk"}),
    ({"attention_chunk": 2, "query_offset": 1, "mask": np.array([[False] * 3] + [[True] * 3] * 5)},
     {0: "bool", 3: "attention_chunk"}),
    ({"attention_chunk": 2, "query_offset": 3, "window": (0, 0), "sink_token_length": 1}, {0: "attention_chunk"}),
    # The left padding: queries before the first real key under the band (P = 2), every key padding (P = Lk), or the
    # key lengths ending inside the padding; a bool mask keeping only padding keys stays the mask's.
    ({"key_leftpad": np.array([2, 0]), "is_causal": True}, {0: "key_leftpad", 1: "key_leftpad"}),
    ({"key_leftpad": np.array([3, 0])}, {i: "key_leftpad" for i in range(6)}),
    ({"key_leftpad": np.array([1, 0]), "key_lengths": np.array([1, 3])}, {i: "key_leftpad" for i in range(6)}),
    ({"key_leftpad": np.array([1, 0]), "mask": np.array([[True] * 3] * 2 + [[True, False, False]] + [[True] * 3] * 3)},
     {2: "bool"}),
    # An older cause that empties a row on its own keeps it: a window past every key beside a chunk and a padding.
    ({"window": (0, 0), "attention_chunk": 2, "key_leftpad": np.array([1, 0])}, {3: "window", 4: "window"}),
])
def test_each_row_is_attributed_to_one_cause(options, expected):
    case = _case(**options)
    judge = _judge(f"{SPEC}:WindowZerosBiasNan")
    causes = judge.row_causes(case, case.rounded("float32"))
    assert causes.shape == (2, 2, 6)
    example = 0  # key_lengths [0, ...] / [1, ...] act on example 0
    for row, cause in expected.items():
        assert causes[example, 0, row] == cause, (row, causes[example, 0])
    empty = judge._fully_masked_rows(case, case.rounded("float32"))
    assert ((causes != "") == empty).all()


def test_a_case_with_a_window_row_and_a_bias_row_takes_both_policies(kept_records):
    case = _window_and_bias_case()
    judge = _judge(f"{SPEC}:WindowZerosBiasNan")
    inputs = case.rounded("float32")
    policy = judge.policy(case, inputs)
    assert policy.shape == (2, 2, 6)
    assert (policy[..., 0] == "nan").all() and (policy[..., 3:] == "zeros").all()
    got, inputs = judge.check(case)
    assert judge.judge(case, got, inputs).status == "deviation"  # rows under a declared non-zeros policy were judged
    with pytest.raises(ConformanceFailure) as raised:
        _judge(f"{SPEC}:WindowZerosBiasNanUndeclared").check(case)
    assert raised.value.clause == "mask.fully-masked-row"
    assert "emptied by window" in str(raised.value) and "'nan'" in str(raised.value)


def test_the_repro_of_a_mixed_case_rebuilds_each_rows_policy(kept_records):
    """A repro prints the per-row policy and its oracle agrees with the judge's (no error, no NaN outside)."""
    import subprocess
    import sys

    case = _window_and_bias_case()
    judge = _judge(f"{SPEC}:WindowZerosBiasNan")
    snippet = judge._snippet(case, case.rounded("float32"))
    assert "policy = np.array(" in snippet
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120,
                          cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.rsplit(" ", 1) for line in done.stdout.strip().splitlines())
    assert float(lines["max abs error"]) < 1e-6 and int(lines["non-finite where the oracle is finite"]) == 0


# ------------------------------------------------------------------ the whole suite on the stand-ins
@pytest.mark.parametrize("member, dtypes, rejected", [
    ("WindowZerosBiasNan", ("float32",), False),
    ("WindowZerosBiasNanUndeclared", ("float32",), True),
    ("NanInFloat16", ("float16", "float32"), False),
    ("NanInFloat16Undeclared", ("float16",), True),
    ("NanInFloat16Callable", ("float16", "float32"), False),
])
def test_a_stand_in_passes_exactly_when_it_declares_what_it_does(member, dtypes, rejected):
    impl = load_implementation(f"{SPEC}:{member}")
    verdicts = run_battery(impl, dtypes=dtypes, max_examples=5, brief=True,
                           stop_on=frozenset({"mask.fully-masked-row"}) if rejected else frozenset())
    assert not verdicts.errors, verdicts.errors[:3]
    if rejected:
        assert "mask.fully-masked-row" in verdicts.clauses, verdicts.failures[:5]
    else:
        assert not verdicts.failures, verdicts.failures[:5]
        assert verdicts.passed > 0


def test_the_callable_gets_the_facts_of_a_deviation_and_the_rows_cause(kept_records):
    NanInFloat16Callable.SEEN.clear()
    case = _case(mask=np.array([[True] * 3] * 5 + [[False] * 3]))
    judge = _judge(f"{SPEC}:NanInFloat16Callable", "float16")
    judge.check(case)
    assert NanInFloat16Callable.SEEN, "the callable was not asked"
    facts = NanInFloat16Callable.SEEN[-1]
    assert facts["cause"] == "bool" and facts["dtype"] == "float16" and facts["fully_masked"]
    assert {"op", "device", "mask_kind", "Lq", "Lk", "variants", "fully_masked_causes"} <= set(facts)


# ------------------------------------------------------------------ the older forms keep their verdicts
LEGACY = ["uniform", "nan", {"bool": "uniform", "float": "nan"}, {"bool": "nan"}, {"float": "uniform"}]
LEGACY_CASES = [
    {"mask": np.array([[True] * 3] * 5 + [[False] * 3]), "window": (0, 0)},
    {"mask": np.where(np.arange(6)[:, None] == 1, -np.inf, np.zeros((6, 3))), "key_lengths": np.array([0, 3])},
    {"mask": np.where(np.eye(6, 3, dtype=bool), -np.inf, 0.0), "is_causal": True},
    {"mask": np.triu(np.ones((6, 3), dtype=bool), 1), "is_causal": True},
    {"window": (0, 0), "key_lengths": np.array([1, 3])},
    {"mask": np.zeros((6, 3)), "window": (0, 0)},
    # Rows a chunk or the left padding empties (before: the case's mask kind, as every row).
    {"mask": np.array([[False] * 3] + [[True] * 3] * 5), "attention_chunk": 2, "query_offset": 1},
    {"mask": np.where(np.arange(6)[:, None] == 4, -np.inf, np.zeros((6, 3))), "key_leftpad": np.array([2, 0]),
     "is_causal": True},
    {"key_leftpad": np.array([3, 1]), "window": (1, 0)},
    {"mask": np.zeros((6, 3)), "attention_chunk": 2, "query_offset": 3, "window": (0, 0), "sink_token_length": 1},
]


@pytest.mark.parametrize("declared", LEGACY, ids=str)
@pytest.mark.parametrize("options", range(len(LEGACY_CASES)))
def test_an_older_form_gives_every_row_its_mask_kinds_policy(declared, options):
    """Before, every fully masked row of a case followed the policy of the case's mask kind ("bool" also for rows
    is_causal, a window or key lengths emptied): the same rows get the same policy now."""
    obj = types.SimpleNamespace(sdpa=WindowZerosBiasNan.sdpa, FULLY_MASKED_ROWS=declared)
    judge = Judge(from_object(obj, "legacy", "legacy"), "float32", "cpu")
    case = _case(**LEGACY_CASES[options])
    inputs = case.rounded("float32")
    mask = inputs.get("mask")
    kind = "float" if mask is not None and mask.dtype != np.bool_ else "bool"
    before = declared if isinstance(declared, str) else declared.get(kind, "zeros")
    empty = judge._fully_masked_rows(case, inputs)
    assert empty.any()
    now = np.broadcast_to(np.asarray(judge.policy(case, inputs)), empty.shape)
    assert (now[empty] == before).all(), (now[empty], before)


def _cause_before(inputs: dict) -> np.ndarray:
    """The attribution before the chunk and the left padding had causes of their own: the first of key_lengths,
    window, causal, bool, float that empties a row on its own, else the case's mask kind (example 0, head 0)."""
    from attention_conformance.conformance.reference import oracle

    lq, lk = inputs["q"].shape[2], inputs["k"].shape[2]
    mask, offset = inputs.get("mask"), inputs.get("query_offset", 0)
    kind = "float" if mask is not None and mask.dtype != np.bool_ else "bool"
    alone = []
    if inputs.get("key_lengths") is not None:
        alone.append(("key_lengths", oracle.positions_allowed(lq, lk, key_lengths=inputs["key_lengths"])))
    if inputs.get("window") is not None:
        alone.append(("window", oracle.positions_allowed(lq, lk, window=inputs["window"], query_offset=offset,
                                                         sink_token_length=inputs.get("sink_token_length", 0))))
    if inputs.get("is_causal"):
        alone.append(("causal", oracle.positions_allowed(lq, lk, True, query_offset=offset)))
    if mask is not None:
        alone.append((kind, mask if kind == "bool" else ~np.isneginf(mask)))
    causes = np.full(lq, kind, dtype="<U16")
    for cause, allowed in reversed(alone):  # the first in the order wins
        keyless = ~np.broadcast_to(allowed, (2, 2, lq, lk))[0, 0].any(axis=-1)
        causes[keyless] = cause
    return causes


OLDER_CAUSE_MAPPING = {"key_lengths": "uniform", "window": "zeros", "causal": "uniform", "bool": "nan",
                       "float": "zeros"}


@pytest.mark.parametrize("options", range(len(LEGACY_CASES)))
def test_an_older_cause_mapping_gives_every_row_the_policy_it_gave_before(options):
    """A mapping by the older causes, without attention_chunk or key_leftpad: each row the policy of its cause as
    attributed before (the chunk's and the left padding's rows fell to the case's mask kind, and still do)."""
    obj = types.SimpleNamespace(sdpa=WindowZerosBiasNan.sdpa, FULLY_MASKED_ROWS=OLDER_CAUSE_MAPPING)
    judge = Judge(from_object(obj, "older", "older"), "float32", "cpu")
    case = _case(**LEGACY_CASES[options])
    inputs = case.rounded("float32")
    empty = judge._fully_masked_rows(case, inputs)[0, 0]
    assert empty.any()
    now = np.broadcast_to(np.asarray(judge.policy(case, inputs)), (2, 2, 6))[0, 0]
    before = np.array([OLDER_CAUSE_MAPPING[cause] for cause in _cause_before(inputs)])
    assert (now[empty] == before[empty]).all(), (now, before, judge.row_causes(case, inputs)[0, 0])


# ------------------------------------------------------------------ the chunk's and the left padding's own policies
ATTENTION_REF = "zoo.correct_fa_attention_ref_rows"
# What could be declared before: the causes of FlashAttention's reference without the chunk and the left padding.
ATTENTION_REF_BEFORE = {"key_lengths": "zeros", "window": "zeros", "causal": "zeros", "bool": "nan", "float": "nan"}


def _attention_ref(declared=None) -> Judge:
    """FlashAttention's reference on rows without keys (zoo member), with its own declaration or ``declared``."""
    import zoo.correct_fa_attention_ref_rows as member

    if declared is None:
        return _judge(ATTENTION_REF)
    obj = types.SimpleNamespace(sdpa=member.sdpa, FULLY_MASKED_ROWS=declared)
    return Judge(from_object(obj, "attention_ref_rows", "attention_ref_rows"), "float32", "cpu")


CHUNK_AND_MASK = {"attention_chunk": 2, "query_offset": 1, "mask": np.array([[False] * 3] + [[True] * 3] * 5)}
LEFTPAD_AND_MASK = {"key_leftpad": np.array([2, 1]), "is_causal": True,
                    "mask": np.where(np.arange(6)[:, None] == 4, -np.inf, np.zeros((6, 3)))}


@pytest.mark.parametrize("options, cause, rows", [
    (CHUNK_AND_MASK, "attention_chunk", (3, 4, 5)),
    (LEFTPAD_AND_MASK, "key_leftpad", (0, 1)),
])
def test_a_chunk_or_padding_row_is_judged_by_its_own_policy(kept_records, options, cause, rows):
    """attention_ref zero-fills a row its chunk or left padding empties and gives NaN for one its mask empties: one
    declaration says both (the member passes), while the older causes could not (the row took the mask's NaN)."""
    case = _case(**options)
    inputs = case.rounded("float32")
    judge = _attention_ref()
    causes, policy = judge.row_causes(case, inputs), np.asarray(judge.policy(case, inputs))
    assert all(causes[0, 0, row] == cause and policy[0, 0, row] == "zeros" for row in rows), (causes[0, 0], policy)
    masked = 0 if cause == "attention_chunk" else 4
    assert causes[0, 0, masked] in ("bool", "float") and policy[0, 0, masked] == "nan"
    got, inputs = judge.check(case)
    assert judge.judge(case, got, inputs).status == "deviation"  # its NaN rows were judged under "nan"
    with pytest.raises(ConformanceFailure) as raised:
        _attention_ref(ATTENTION_REF_BEFORE).check(case)
    assert raised.value.clause == "mask.fully-masked-row"
    assert f"emptied by {cause}" in str(raised.value) and "'nan'" in str(raised.value)


@pytest.mark.parametrize("declared, expected", [
    ({"attention_chunk": "uniform", "key_leftpad": "nan", "bool": "zeros"}, ("uniform", "nan", "zeros")),
    ({"attention_chunk": "nan", "key_leftpad": "uniform", "bool": "uniform"}, ("nan", "uniform", "uniform")),
    ({"bool": "nan"}, ("nan", "nan", "nan")),  # without them: the mask kind's entry
])
def test_each_new_cause_takes_its_own_entry(declared, expected):
    """One case with a row of each: a chunk's (rows 3-5 of example 0), the left padding's (rows 0-1 of example 1)
    and a bool mask's (row 0 of example 0 and, in the padding, none of example 1's others)."""
    mask = np.ones((2, 1, 6, 3), dtype=bool)
    mask[0, :, 0] = False
    case = _case(attention_chunk=2, query_offset=1, key_leftpad=np.array([0, 3]), mask=mask)
    obj = types.SimpleNamespace(sdpa=WindowZerosBiasNan.sdpa, FULLY_MASKED_ROWS=declared)
    judge = Judge(from_object(obj, "causes", "causes"), "float32", "cpu")
    inputs = case.rounded("float32")
    causes = judge.row_causes(case, inputs)
    policy = np.broadcast_to(np.asarray(judge.policy(case, inputs)), causes.shape)
    assert causes[0, 0, 3] == "attention_chunk" and causes[1, 0, 0] == "key_leftpad" and causes[0, 0, 0] == "bool"
    assert (policy[0, 0, 3], policy[1, 0, 0], policy[0, 0, 0]) == expected


# ------------------------------------------------------------------ declarations that are wrong
@pytest.mark.parametrize("declared, words", [
    ("mean", ["FULLY_MASKED_ROWS='mean'", "'zeros', 'nan', 'uniform'"]),
    ({"padding": "zeros"}, ["FULLY_MASKED_ROWS has key 'padding'",
                            "key_lengths, window, causal, attention_chunk, key_leftpad, bool, float"]),
    ({"window": "mean"}, ["FULLY_MASKED_ROWS['window']='mean'"]),
    ({"float16": "nan", "window": "zeros"}, ["mixes dtypes and other keys", "'window'"]),
    ({"float16": {"bool": "nan", "padding": "zeros"}}, ["FULLY_MASKED_ROWS['float16'] has key 'padding'"]),
    ({"float16": "average"}, ["FULLY_MASKED_ROWS['float16']='average'"]),
    ({}, ["FULLY_MASKED_ROWS={}"]),
    (3, ["FULLY_MASKED_ROWS=3"]),
])
def test_a_wrong_declaration_is_a_load_error_naming_the_attribute_and_key(declared, words):
    obj = types.SimpleNamespace(sdpa=WindowZerosBiasNan.sdpa, FULLY_MASKED_ROWS=declared)
    with pytest.raises(ImplementationLoadError) as raised:
        from_object(obj, "bad", "my_module:bad")
    message = str(raised.value)
    assert message.startswith("my_module:bad: ")
    for word in words:
        assert word in message, message


def test_a_callable_returning_no_policy_is_named_when_asked(kept_records):
    obj = types.SimpleNamespace(sdpa=WindowZerosBiasNan.sdpa, FULLY_MASKED_ROWS=lambda facts: "mean")
    judge = Judge(from_object(obj, "bad", "my_module:bad"), "float32", "cpu")
    with pytest.raises(ImplementationLoadError, match=r"my_module:bad: FULLY_MASKED_ROWS returned 'mean' for a row "
                                                       r"emptied by 'window'"):
        judge.check(_case(window=(0, 0)))


def test_the_report_describes_each_form():
    assert load_implementation(f"{SPEC}:NanInFloat16").describe()["fully_masked_rows"] == \
        {"float16": "nan", "float32": "uniform"}
    described = load_implementation(f"{SPEC}:NanInFloat16Callable").describe()["fully_masked_rows"]
    assert described == "callable tests.test_fully_masked_rows.NanInFloat16Callable.FULLY_MASKED_ROWS"


def test_fully_masked_causes_without_a_fully_masked_row_is_empty():
    empty = np.zeros((1, 1, 3), dtype=bool)
    assert (fully_masked_causes(empty, 3, 2, np.zeros((3, 2), dtype=bool), True) == "").all()


class Float64InFloat32:
    """HF eager attention's float64: every input computed in float32 (declared, float64_computed_in_float32), where
    its additive finfo(float64).min is -inf, so a row without keys is NaN although FULLY_MASKED_ROWS says the mean of v
    (what the finite fill gives in float32)."""

    DTYPES = ("float64",)
    FULLY_MASKED_ROWS = "uniform"

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        s, keep, v64, _ = _attention_parts(q, k, v, mask, is_causal, scale)
        fill = np.float32(-np.inf)  # finfo(float64).min in float32
        weights = _plain_softmax(np.where(keep, s, fill).astype(np.float32))
        return (weights @ v64.astype(np.float32)).astype(np.float64)


class Float64InFloat32Declared(Float64InFloat32):
    KNOWN_DEVIATIONS = (deviations.float64_computed_in_float32(),)


def test_rows_with_keys_off_by_a_declared_error_leave_the_empty_rows_to_their_own_clause(kept_records):
    """A fully masked row's verdict yields to the values of the rows with keys where those are wrong too, but not where
    their error is declared: HF eager attention's float64 cases (float32 arithmetic, declared) had their NaN empty
    rows filed under sdpa.finite, which no deviation can declare; they are a deviation of mask.fully-masked-row."""
    mask = np.ones((6, 3), dtype=bool)
    mask[2] = False
    case = _case(mask=mask)
    undeclared = from_object(Float64InFloat32, "float64_in_float32", "tests:float64_in_float32")
    with pytest.raises(ConformanceFailure, match=r"\[sdpa\.finite\]"):
        Judge(undeclared, "float64", "cpu").check(case)
    declared = from_object(Float64InFloat32Declared, "declared", "tests:declared")
    with pytest.raises(pytest.xfail.Exception, match=r"mask\.fully-masked-row"):
        Judge(declared, "float64", "cpu").check(case)

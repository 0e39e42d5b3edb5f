"""The worked examples of fixtures/: loaded through safe YAML and their schema, their shapes cross-checked, and every
one checked against the oracle when it loads (a fixture the oracle does not bear out stops the run, naming the file,
the entry and the field). Read once per session and cached.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attention_conformance.conformance.specdata import (
    FIXTURES_DIR,
    Clause,
    SpecError,
    schema_problems,
    clauses,
    read_yaml,
    relative,
)

REQUIRED_INPUTS = {
    "softmax": ("x",),
    "sdpa": ("q", "k", "v"),
    "scores": ("q", "k"),
    "multi_head_attention": ("query", "key", "value", "params", "num_heads"),
    "sdpa_varlen": ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
    "sdpa_paged": ("q", "k_cache", "v_cache", "block_table", "seqused_k"),
}


# Integer inputs (lengths, offsets, block tables): int32 arrays, not float arrays.
INTEGER_INPUTS = ("query_lengths", "key_lengths", "key_leftpad", "cu_seqlens_q", "cu_seqlens_k", "seqused_k",
                  "block_table")


# ------------------------------------------------------------------ fixtures
@dataclass
class Fixture:
    id: str
    kind: str
    op: str
    clauses: tuple[str, ...]
    source: str
    document: str
    path: Path
    inputs: dict[str, Any]  # arrays materialised as float64 / bool NumPy arrays
    expected: np.ndarray | None = None
    expected_shape: tuple[int, ...] | None = None
    expected_lse: np.ndarray | None = None  # sdpa with return_lse: each row's printed log-sum-exp
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    atol: float = 0.0
    rtol: float = 0.0
    tolerance_reason: str = ""
    description: str = ""
    alignment: str = "bottom-right"  # sdpa_varlen, sdpa_paged: the SEQUENCE_ALIGNMENT of the printed values
    dtypes: tuple[str, ...] = ()  # the 8-bit dtypes an FP8 fixture runs in; () for every other fixture

    def runs_in(self, dtype: str) -> bool:
        """Whether the fixture runs in ``dtype``: an 8-bit fixture in its own 8-bit dtypes, every other one in the
        16/32/64-bit dtypes."""
        from attention_conformance.implementations.arrays import is_eight_bit

        return dtype in self.dtypes if self.dtypes else not is_eight_bit(dtype)

    @property
    def arrays(self) -> dict[str, Any]:
        return {k: v for k, v in self.inputs.items() if isinstance(v, (np.ndarray, dict))}

    @property
    def options(self) -> dict[str, Any]:
        return {k: v for k, v in self.inputs.items() if not isinstance(v, (np.ndarray, dict))}


def materialise(value: Any, path: Path, entry: str, field_: str) -> np.ndarray:
    if isinstance(value, dict):
        spec = value["random"]
        rng = np.random.default_rng(spec["seed"])
        if spec.get("distribution", "normal") == "uniform":
            return rng.uniform(size=spec["shape"])
        return rng.standard_normal(size=spec["shape"])
    try:
        array = np.array(value)
    except ValueError as exc:
        raise SpecError(path, entry, field_, f"ragged array: {exc}") from None
    if array.dtype == np.bool_:
        return array
    if array.dtype.kind not in "iuf":
        raise SpecError(path, entry, field_, f"array of {array.dtype} values; numbers or booleans expected")
    return array.astype(np.float64)


def _check_shapes(fx: Fixture) -> np.ndarray:
    """Contradictory shapes are a spec defect: find them with the oracle before any implementation runs.

    Returns the oracle's result on the fixture's inputs."""
    from attention_conformance.conformance.reference import oracle

    def fail(field_: str, problem: str):
        raise SpecError(fx.path, fx.id, field_, problem)

    inputs = fx.inputs
    if fx.op in ("sdpa", "scores"):
        for name in ("q", "k", "v"):
            if name in inputs and inputs[name].ndim != 4:
                fail(f"inputs.{name}", f"must be 4-D (B, H, L, D), got shape {inputs[name].shape}")
        q, k = inputs["q"], inputs["k"]
        if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
            fail("inputs.k", f"shape {k.shape} does not fit q {q.shape} (same B and Dk, Hkv dividing Hq)")
        b, hq, lq = q.shape[:3]
        for name, limit in (("query_lengths", lq), ("key_lengths", k.shape[2]), ("key_leftpad", k.shape[2])):
            if name in inputs and (inputs[name].shape != (b,) or (inputs[name] > limit).any()):
                fail(f"inputs.{name}", f"{inputs[name].tolist()}: {b} length(s) (B,) each at most {limit} expected")
        _check_head_parameters(inputs, b, hq, fail)
        _check_eight_bit(fx, fail)
        if "v" in inputs and inputs["v"].shape[:3] != k.shape[:3]:
            fail("inputs.v", f"shape {inputs['v'].shape} does not fit k {k.shape} (same B, Hkv, Lk)")
        if "mask" in inputs:
            target = q.shape[:2] + (q.shape[2], k.shape[2])
            try:
                np.broadcast_shapes(inputs["mask"].shape, target)
            except ValueError:
                fail("inputs.mask", f"shape {inputs['mask'].shape} does not broadcast to {target}")
    if fx.op in ("sdpa_varlen", "sdpa_paged"):
        _check_sequence_shapes(fx, fail)
    trace: dict[str, np.ndarray] = {}
    try:
        if fx.shapes and fx.op == "multi_head_attention":  # one oracle run gives the result and the trace
            reference = oracle.multi_head_attention(**_call_arguments(fx), trace=trace)
        else:
            reference = run_oracle(fx)
    except Exception as exc:  # the oracle rejects what the shapes cannot mean
        fail("inputs", f"the oracle cannot run these inputs: {type(exc).__name__}: {exc}")
    if fx.expected is not None and fx.expected.shape != reference.shape:
        fail("expected", f"shape {fx.expected.shape} but the inputs give {reference.shape}")
    if fx.expected_shape is not None and tuple(fx.expected_shape) != reference.shape:
        fail("expected_shape", f"{list(fx.expected_shape)} but the inputs give {list(reference.shape)}")
    if fx.shapes:
        if fx.op != "multi_head_attention":
            fail("shapes", "intermediate shapes are traced for multi_head_attention only")
        for name, shape in fx.shapes.items():
            if name not in trace:
                fail(f"shapes.{name}", "the pipeline has no such intermediate for these inputs")
            if tuple(shape) != trace[name].shape:
                fail(f"shapes.{name}", f"{list(shape)} but the pipeline gives {list(trace[name].shape)}")
    return reference


def _check_sequence_shapes(fx: Fixture, fail) -> None:
    """sdpa_varlen's packed tensors and offsets, sdpa_paged's caches and table, against each other (varlen.cu-seqlens,
    paged.block-table): a fixture that contradicts the contract's shapes is a spec defect."""
    inputs = fx.inputs
    q = inputs["q"]
    if fx.op == "sdpa_varlen":
        for name in ("q", "k", "v"):
            if inputs[name].ndim != 3:
                fail(f"inputs.{name}", f"must be 3-D (total, H, D), got shape {inputs[name].shape}")
        k, v = inputs["k"], inputs["v"]
        if k.shape[0] != v.shape[0] or k.shape[1] != v.shape[1] or q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
            fail("inputs.k", f"k {k.shape} and v {v.shape} do not fit q {q.shape} (same total_k and Hkv, Dk, Hkv | Hq)")
        for name, total in (("cu_seqlens_q", q.shape[0]), ("cu_seqlens_k", k.shape[0])):
            starts = inputs[name]
            if starts[0] != 0 or starts[-1] != total or (np.diff(starts) < 0).any():
                fail(f"inputs.{name}", f"{starts.tolist()}: offsets from 0, non-decreasing, ending at {total} expected")
        if len(inputs["cu_seqlens_q"]) != len(inputs["cu_seqlens_k"]):
            fail("inputs.cu_seqlens_k", "as many offsets as cu_seqlens_q (B + 1) expected")
        lengths = np.diff(inputs["cu_seqlens_k"])
        for name, limit in (("max_seqlen_q", np.diff(inputs["cu_seqlens_q"]).max()), ("max_seqlen_k", lengths.max())):
            if inputs[name] != limit:
                fail(f"inputs.{name}", f"{inputs[name]}: the longest sequence's {limit} expected")
        used = inputs.get("seqused_k")
        if used is not None and (used.shape != lengths.shape or (used > lengths).any()):
            fail("inputs.seqused_k", f"{used.tolist()}: (B,) each at most its sequence's keys {lengths.tolist()}")
        b = len(lengths)
    else:
        if q.ndim != 4:
            fail("inputs.q", f"must be 4-D (B, H, L, D), got shape {q.shape}")
        cache, values, table, used = inputs["k_cache"], inputs["v_cache"], inputs["block_table"], inputs["seqused_k"]
        if cache.ndim != 4 or values.shape[:3] != cache.shape[:3] or cache.shape[3] != q.shape[3] \
                or q.shape[1] % cache.shape[2]:
            fail("inputs.k_cache", f"k_cache {cache.shape} and v_cache {values.shape} do not fit q {q.shape} "
                 "((num_blocks, block_size, Hkv, D), Hkv | Hq)")
        b = q.shape[0]
        if table.ndim != 2 or table.shape[0] != b or (table >= cache.shape[0]).any():
            fail("inputs.block_table", f"{table.tolist()}: (B, max_blocks) page indices below {cache.shape[0]} expected")
        if used.shape != (b,) or (used > table.shape[1] * cache.shape[1]).any():
            fail("inputs.seqused_k", f"{used.tolist()}: (B,) each at most max_blocks * block_size expected")
    _check_head_parameters(inputs, b, q.shape[1], fail)


def _check_head_parameters(inputs: dict, b: int, hq: int, fail) -> None:
    """ALiBi slopes (Hq,) or (B, Hq) and learnable sink logits (Hq,), finite."""
    slopes = inputs.get("alibi_slopes")
    if slopes is not None and slopes.shape not in ((hq,), (b, hq)):
        fail("inputs.alibi_slopes", f"shape {slopes.shape}; (Hq,) = ({hq},) or (B, Hq) = ({b}, {hq}) expected")
    sink = inputs.get("learnable_sink")
    if sink is not None and (sink.shape != (hq,) or not np.isfinite(sink).all()):
        fail("inputs.learnable_sink", f"{sink.tolist()}: (Hq,) = ({hq},) finite logits expected")


def _check_eight_bit(fx: Fixture, fail) -> None:
    """An FP8 fixture: descale factors of shape (B, Hkv), finite and float32-exact, and q, k, v exactly
    representable in each of its 8-bit dtypes (else the rounding to the dtype would change the case the printed
    values are of); descales only beside 8-bit dtypes."""
    from attention_conformance.conformance.reference import oracle

    inputs = fx.inputs
    descales = {name: inputs[name] for name in oracle.DESCALES if name in inputs}
    if descales and not fx.dtypes:
        fail(f"inputs.{next(iter(descales))}", "descale factors need `dtypes`: the 8-bit dtypes the fixture runs in")
    k = inputs["k"]
    for name, factors in descales.items():
        if factors.shape != k.shape[:2] or not np.isfinite(factors).all() \
                or (factors.astype(np.float32) != factors).any():
            fail(f"inputs.{name}", f"{factors.tolist()}: (B, Hkv) = {k.shape[:2]} finite float32 values expected")
    from attention_conformance.implementations.arrays import dtype_unavailable_reason, numpy_dtype

    for dtype in fx.dtypes:
        if dtype_unavailable_reason(dtype):
            continue  # no 8-bit input can be made here: the fixture's 8-bit items are skipped with that reason
        for name in ("q", "k", "v"):
            if name in inputs and (inputs[name].astype(numpy_dtype(dtype)).astype(np.float64) != inputs[name]).any():
                fail(f"inputs.{name}", f"values not exactly representable in {dtype} (listed in `dtypes`)")


def _call_arguments(fx: Fixture) -> dict[str, Any]:
    return dict(fx.inputs)


def run_oracle(fx: Fixture, inputs: dict[str, Any] | None = None, policy: str = "zeros") -> np.ndarray:
    """The oracle's result for a fixture's operation (on ``inputs`` if given, e.g. rounded to a dtype)."""
    from attention_conformance.conformance.reference import oracle

    args = dict(fx.inputs if inputs is None else inputs)
    args.pop("return_lse", None)  # the output's oracle; the lse's is oracle_lse
    if fx.op == "softmax":
        return oracle.softmax(args["x"], axis=args.get("axis", -1))
    if fx.op == "scores":
        return oracle.scores(args["q"], args["k"], args.get("mask"), args.get("is_causal", False), args.get("scale"))
    if fx.op == "sdpa":
        return oracle.sdpa(
            args["q"], args["k"], args["v"], args.get("mask"), args.get("is_causal", False), args.get("scale"),
            fully_masked_rows_policy=policy, **oracle.variant_options(args), **oracle.descale_options(args),
        )
    if fx.op == "sdpa_varlen":
        return oracle.sdpa_varlen(**args, fully_masked_rows_policy=policy, alignment=fx.alignment)
    if fx.op == "sdpa_paged":
        return oracle.sdpa_paged(**args, fully_masked_rows_policy=policy, alignment=fx.alignment)
    return oracle.multi_head_attention(**args)


def oracle_lse(fx: Fixture, inputs: dict[str, Any] | None = None) -> np.ndarray:
    """The oracle's log-sum-exp of an sdpa fixture (on ``inputs`` if given): (B, Hq, Lq), natural log."""
    from attention_conformance.conformance.reference import oracle

    args = dict(fx.inputs if inputs is None else inputs)
    return oracle.attention(args["q"], args["k"], args["v"], args.get("mask"), args.get("is_causal", False),
                            args.get("scale"), **oracle.variant_options(args)).lse()


def within_printed_lse(fx: Fixture, lse: np.ndarray) -> np.ndarray:
    """Row by row: ``lse`` reproduces the fixture's printed expected_lse within its atol (the same infinity counts)."""
    with np.errstate(invalid="ignore"):
        return (np.isinf(lse) & (lse == fx.expected_lse)) | (np.abs(lse - fx.expected_lse) <= fx.atol)


def oracle_disagreement(fx: Fixture, got: np.ndarray | None = None) -> str | None:
    """Why the oracle does not bear the fixture out (None: it does).

    An example's printed ``expected`` values must be reproduced within the fixture's
    tolerance; a counterexample's must not be; a fixture without printed values must
    give finite results (or -inf scores). ``got``: the oracle's result, if computed.
    """
    got = run_oracle(fx) if got is None else got
    if fx.expected is None:
        if np.all(np.isfinite(got) | np.isneginf(got)):
            return None
        bad = ~(np.isfinite(got) | np.isneginf(got))
        return f"the oracle gives {int(bad.sum())} non-finite value(s), first at index {_first(bad)}"
    if fx.expected.shape != got.shape:
        return f"shape {fx.expected.shape} but the inputs give {got.shape}"
    within = within_printed(fx, got)
    if fx.kind == "example" and not within.all():
        index = _first(~within)
        return (f"the oracle does not reproduce the printed values: {int((~within).sum())} of {within.size} differ "
                f"beyond atol {fx.atol:g} + rtol {fx.rtol:g}; first at index {index}: expected "
                f"{fx.expected[index]:.9g}, oracle {got[index]:.9g}")
    if fx.kind == "counterexample" and within.all():
        return (f"the oracle reproduces this counterexample within atol {fx.atol:g} + rtol {fx.rtol:g}: "
                "a counterexample must be values a correct implementation does not give")
    return None


def within_printed(fx: Fixture, got: np.ndarray, slack=0.0) -> np.ndarray:
    """Elementwise: ``got`` reproduces the fixture's printed values within its atol + rtol, plus ``slack`` (the same
    NaN or infinity counts), or the element is not compared (judged_elements)."""
    same_special = (np.isnan(got) & np.isnan(fx.expected)) | (np.isinf(got) & (got == fx.expected))
    with np.errstate(invalid="ignore"):
        within = same_special | (np.abs(got - fx.expected) <= fx.atol + fx.rtol * np.abs(fx.expected) + slack)
    return within | ~judged_elements(fx, got.shape)


def judged_elements(fx: Fixture, shape: tuple[int, ...]) -> np.ndarray:
    """Output elements a fixture's printed values are compared on: all but the padding rows of sdpa.varlen
    (rows i >= query_lengths[b], unspecified; a fixture prints them as .nan), in sdpa and multi_head_attention."""
    from attention_conformance.conformance.reference import oracle

    if fx.op not in ("sdpa", "multi_head_attention") or fx.inputs.get("query_lengths") is None:
        return np.ones(shape, dtype=bool)
    if fx.op == "multi_head_attention":  # mha.variants: the rows of (B, Lq, E_out)
        return np.broadcast_to(oracle.mha_judged_rows(fx.inputs["query"], fx.inputs["query_lengths"]), shape)
    return np.broadcast_to(oracle.judged_rows(fx.inputs["q"], fx.inputs["query_lengths"])[..., None], shape)


def _first(where: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(where)[0])


def load_fixture_file(path: Path, known_clauses: dict[str, Clause]) -> list[Fixture]:
    """The fixtures of one file, each checked against the schema, its shapes and the oracle's values.

    Every problem of the file is collected (the first of each entry: later checks of an
    entry need the earlier ones) and raised as one SpecError.
    """
    document = read_yaml(path)
    schema_errors = schema_problems(document, "fixtures.schema.yaml", path, "fixtures")
    problems = [error for _, error in schema_errors]
    if any(index is None for index, _ in schema_errors):
        raise SpecError.of(problems)
    broken_entries = {index for index, _ in schema_errors}
    found = []
    for position, item in enumerate(document["fixtures"]):
        if position in broken_entries:
            continue
        try:
            found.append(_load_entry(path, document, item, known_clauses))
        except SpecError as exc:
            problems.append(exc)
    if problems:
        raise SpecError.of(problems)
    return found


def _load_entry(path: Path, document: dict, item: dict, known_clauses: dict[str, Clause]) -> Fixture:
    entry = item["id"]
    unknown = [SpecError(path, entry, f"clauses[{index}]", f"unknown clause {clause!r}")
               for index, clause in enumerate(item["clauses"]) if clause not in known_clauses]
    if unknown:
        raise SpecError.of(unknown)
    missing = [n for n in REQUIRED_INPUTS[item["op"]] if n not in item["inputs"]]
    if missing:
        raise SpecError(path, entry, f"inputs.{missing[0]}", f"op {item['op']} needs inputs {missing}")
    inputs: dict[str, Any] = {}
    for name, value in item["inputs"].items():
        if name == "window":  # (left, right), None unbounded: structure, not an array
            inputs[name] = tuple(value)
        elif name in INTEGER_INPUTS:
            inputs[name] = np.asarray(value, dtype=np.int32)
        elif name == "params":
            inputs[name] = {p: materialise(a, path, entry, f"inputs.params.{p}") for p, a in value.items()}
        elif isinstance(value, (list, dict)):
            inputs[name] = materialise(value, path, entry, f"inputs.{name}")
        else:
            inputs[name] = value
    tolerance = item.get("tolerance", {})
    fx = Fixture(
        id=entry,
        kind=item["kind"],
        op=item["op"],
        clauses=tuple(item["clauses"]),
        source=item["source"],
        document=document["document"],
        path=path,
        inputs=inputs,
        expected=materialise(item["expected"], path, entry, "expected") if "expected" in item else None,
        expected_shape=tuple(item["expected_shape"]) if "expected_shape" in item else None,
        expected_lse=materialise(item["expected_lse"], path, entry, "expected_lse") if "expected_lse" in item else None,
        shapes={k: tuple(v) for k, v in item.get("shapes", {}).items()},
        atol=float(tolerance.get("atol", 0.0)),
        rtol=float(tolerance.get("rtol", 0.0)),
        tolerance_reason=tolerance.get("reason", ""),
        description=item.get("description", ""),
        alignment=item.get("alignment", "bottom-right"),
        dtypes=tuple(item.get("dtypes", ())),
    )
    if fx.expected is not None and "atol" not in tolerance:
        raise SpecError(path, entry, "tolerance", "a fixture with printed `expected` values needs a tolerance")
    if fx.kind == "counterexample" and fx.expected is None:
        raise SpecError(path, entry, "expected", "a counterexample needs the values it must not produce")
    reference = _check_shapes(fx)
    # The printed values against the oracle, when the fixtures load (every run, --impl included):
    # a fixture the oracle does not bear out would fail a correct implementation.
    problem = oracle_disagreement(fx, reference)
    if problem:
        raise SpecError(path, entry, "expected", problem)
    if fx.expected_lse is not None:
        if fx.op != "sdpa" or not fx.inputs.get("return_lse"):
            raise SpecError(path, entry, "expected_lse", "printed lse values need op sdpa and inputs.return_lse: true")
        lse = oracle_lse(fx)
        if lse.shape != fx.expected_lse.shape or not within_printed_lse(fx, lse).all():
            raise SpecError(path, entry, "expected_lse", f"the oracle's lse {np.round(lse, 10).tolist()} does not "
                                                         f"reproduce the printed values within atol {fx.atol:g}")
    return fx


@functools.lru_cache(maxsize=None)
def fixtures(fixtures_dir: Path = FIXTURES_DIR) -> tuple[Fixture, ...]:
    """Every fixture of the directory, checked (schema, shapes, the oracle's values); all problems in one SpecError."""
    known = clauses()
    found: list[Fixture] = []
    seen: dict[str, Path] = {}
    problems: list[SpecError] = []
    paths = sorted(Path(fixtures_dir).glob("*.yaml"))
    if not paths:
        raise SpecError(Path(fixtures_dir), None, None, f"no *.yaml fixture file in {Path(fixtures_dir).resolve()} "
                        "(an installed suite ships fixtures/ as package data: reinstall the suite; "
                        "$ATTENTION_CONFORMANCE_FIXTURES names another directory)")
    for path in paths:
        try:
            loaded = load_fixture_file(path, known)
        except SpecError as exc:
            problems.append(exc)
            continue
        for fx in loaded:
            if fx.id in seen:
                problems.append(SpecError(path, fx.id, "id", f"duplicate fixture id (also in {relative(seen[fx.id])})"))
                continue
            seen[fx.id] = path
            found.append(fx)
    if problems:
        raise SpecError.of(problems)
    return tuple(found)

"""Verdict messages, copy-pasteable repros, and the per-case records kept for the report."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .cases import DESCALES
from .specdata import clauses


@dataclass
class CaseRecord:
    """One case's outcome, as written to the JSON report."""

    test: str
    implementation: str
    clause: str
    case: str
    op: str
    dtype: str
    device: str
    status: str  # passed | failed | skipped | unsupported | deviation
    max_abs_error: float | None = None
    allowed: float | None = None
    ratio: float | None = None
    message: str = ""
    shapes: dict[str, list[int]] = field(default_factory=dict)
    repro_id: str = ""  # a failure whose repro file was saved (conformance/repro.py): its ID

    def as_dict(self, repro: bool = True) -> dict[str, Any]:
        """The record as written to the JSON report (docs/report.md, ``cases[]``), compacted.

        Always: test, implementation, clause, case, op, dtype, device, status. A figure
        (max_abs_error, allowed, ratio) only when it is a finite number, rounded to
        FIGURE_DIGITS significant digits (a ratio never rounds across 1); shapes (as
        one string, see ``shapes_text``) only for a record that did not pass; message
        only when not empty; repro (the ID of its saved repro file) for a failure whose
        file was saved. ``repro=False`` leaves the repro command out of a failure's
        message (json_report keeps it in the last failing record of each test, clause,
        device and dtype).
        """
        data: dict[str, Any] = {"test": self.test, "implementation": self.implementation, "clause": self.clause,
                                "case": self.case, "op": self.op, "dtype": self.dtype, "device": self.device,
                                "status": self.status}
        for key in ("max_abs_error", "allowed", "ratio"):
            value = getattr(self, key)
            if value is not None and np.isfinite(value):
                data[key] = _figure(float(value), ratio=key == "ratio")
        message = self.message if repro else without_repro(self.message)
        if message:
            data["message"] = message
        if self.status != "passed" and self.shapes:
            data["shapes"] = shapes_text(self.shapes)
        if self.repro_id:
            data["repro"] = self.repro_id
        return data

    def transport(self) -> dict[str, Any]:
        """Every field as plain Python values, for an xdist worker to send the controller (``from_transport``)."""
        # Field by field, not dataclasses.asdict (its deep copies were a third of a worker's streaming time).
        data = {name: getattr(self, name) for name in _FIELD_NAMES}
        for key in ("max_abs_error", "allowed", "ratio"):
            data[key] = None if data[key] is None else float(data[key])
        data["shapes"] = {name: [int(n) for n in shape] for name, shape in data["shapes"].items()}
        return {key: value for key, value in data.items() if value is not None and value != "" and value != {}}

    @classmethod
    def from_transport(cls, data: dict[str, Any]) -> "CaseRecord":
        return cls(**data)

    @classmethod
    def from_report(cls, data: dict[str, Any], op: str = "") -> "CaseRecord":
        """A record of a report's ``cases`` again (the inverse of ``as_dict``; what the report left out stays empty).
        ``op``: the operation of a record from a report that wrote none for a passed case (before it always did)."""
        return cls(test=data.get("test", ""), implementation=data["implementation"], clause=data["clause"],
                   case=data.get("case", ""), op=data.get("op") or op, dtype=data["dtype"], device=data["device"],
                   status=data["status"], max_abs_error=data.get("max_abs_error"), allowed=data.get("allowed"),
                   ratio=data.get("ratio"), message=data.get("message", ""),
                   shapes={name: list(shape) for name, shape in parse_shapes(data.get("shapes", "")).items()})


_FIELD_NAMES = tuple(f.name for f in fields(CaseRecord))
JUDGED = ("passed", "failed", "deviation")  # statuses of a case the implementation ran and was judged on


def case_key(rec: CaseRecord) -> tuple:
    """What makes a record one case: the test (its id names implementation, device and dtype), the case label,
    the clause and the status; implementation, op, device and dtype too, for a test id that does not name them."""
    return (rec.test, rec.implementation, rec.op, rec.device, rec.dtype, rec.case, rec.clause, rec.status)


def distinct(records) -> list[CaseRecord]:
    """One record per case (``case_key``), at the place of its first.

    The same case can leave several records: Hypothesis replays an example (its final failure, a random draw
    equal to a covering corner), and a property may check one case several times under one clause (each head of
    it alone, say: sdpa.batch-head-independence). It is still one case judged. Of a failure the last record is
    kept (it has the repro the terminal showed); otherwise the one with the largest ratio (the worst check).
    """
    index: dict[tuple, int] = {}
    out: list[CaseRecord] = []
    for rec in records:
        key = case_key(rec)
        if key not in index:
            index[key] = len(out)
            out.append(rec)
        elif rec.status == "failed" or _worst_ratio(rec) >= _worst_ratio(out[index[key]]):
            out[index[key]] = rec
    return out


def _worst_ratio(rec: CaseRecord) -> float:
    return -1.0 if rec.ratio is None or rec.ratio != rec.ratio else float(rec.ratio)


FIGURE_DIGITS = 6
# The line before a failure's repro command (conformance/repro.py): --impl modules import from that directory.
REPRO_HEADING = "repro (run in the directory pytest ran in):"
REPRO_LEFT_OUT = "repro: left out here; the last failing record of this test, clause, device and dtype has it"


def _figure(value: float, ratio: bool = False) -> float:
    """``value`` to FIGURE_DIGITS significant digits; a ratio keeps its side of 1 (the verdict's threshold)."""
    short = float(f"{value:.{FIGURE_DIGITS}g}")
    return value if ratio and (short > 1) != (value > 1) else short


def without_repro(message: str) -> str:
    """A failure message without its repro command (everything from the line REPRO_HEADING on)."""
    lines = message.split("\n")
    for index, line in enumerate(lines):
        if line.strip() == REPRO_HEADING:
            return "\n".join(lines[:index] + ["  " + REPRO_LEFT_OUT])
    return message


def shapes_text(shapes: dict[str, Any]) -> str:
    """Input shapes as one string, e.g. ``q=1x2x5x8 k=1x1x7x8 mask=1x1x5x7`` (a 0-d input is ``name=()``)."""
    return " ".join(f"{name}={'x'.join(str(int(n)) for n in shape) or '()'}" for name, shape in shapes.items())


def parse_shapes(text: str) -> dict[str, tuple[int, ...]]:
    """The inverse of ``shapes_text``."""
    shapes = {}
    for item in text.split():
        name, _, dims = item.rpartition("=")
        shapes[name] = () if dims == "()" else tuple(int(n) for n in dims.split("x"))
    return shapes


class ConformanceFailure(AssertionError):
    """A verdict against an implementation. ``clause`` is the clause it breaks; ``evidence`` what its repro file
    holds (conformance/repro.py), from which the terminal's failure block is written (failure_block.py)."""

    def __init__(self, clause: str, message: str, record: CaseRecord | None = None, evidence=None):
        self.clause = clause
        self.record = record
        self.evidence = evidence
        super().__init__(message)


def _array_literal(array: np.ndarray, dtype: str) -> str:
    if array.dtype == np.bool_:
        return f"np.array({array.tolist()!r}, dtype=bool)"
    values = np.asarray(array, dtype=np.float64).tolist()
    body = repr(values).replace("inf", "np.inf").replace("nan", "np.nan")
    if dtype == "bfloat16" or dtype.startswith("float8_"):  # NumPy has neither: ml_dtypes' types
        return f"np.array({body}).astype(ml_dtypes.{dtype})"
    return f"np.array({body}, dtype=np.{dtype})"


def array_source(arrays_file: str | None, dtype: str):
    """(lines to put first, source(name, key, array, dtype) of one input array) for a repro snippet.

    Inline literals by default; with ``arrays_file`` (a repro's .npz, conformance/repro.py) the inputs are read from
    it and rounded to ``dtype`` as the run rounded them (Case.rounded), however large they are.
    """
    if arrays_file is None:
        return [], lambda name, key, array, own: _array_literal(array, own)
    prelude = ["from pathlib import Path",
               "from attention_conformance.conformance import repro",
               f"inputs = repro.load(Path({arrays_file!r})).case.rounded({dtype!r})"]
    return prelude, lambda name, key, array, own: f"inputs[{name!r}]" + (f"[{key!r}]" if key is not None else "")


def _own_dtype(name: str, value: np.ndarray, dtype: str) -> str:
    # Lengths (int32), ALiBi slopes and sink logits (float32/float64) keep their own dtype (README, "The contract").
    own = value.dtype.kind in "iu" or name in ("alibi_slopes", "learnable_sink", *DESCALES)
    return str(value.dtype) if own else dtype


def repro(impl_spec: str, op: str, inputs: dict[str, Any], dtype: str, device: str, policy="zeros",
          layout: str = "bhld", arrays_file: str | None = None, alignment: str | None = None,
          output_layout: str | None = None) -> str:
    """A snippet that rebuilds the inputs, calls the implementation and prints its error against the oracle.

    ``policy``: the FULLY_MASKED_ROWS policy of the case's fully masked rows, or (B, Hq, Lq) names, one per row.
    ``layout``: the implementation's LAYOUT; impl.call hands q, k, v over in it. ``output_layout``: the output's
    (OUTPUT_LAYOUT; None: LAYOUT's), which impl.call reads back.
    ``arrays_file``: read the inputs from this repro file instead of printing them (array_source).
    ``alignment``: the implementation's SEQUENCE_ALIGNMENT, passed to the oracle of sdpa_varlen and sdpa_paged (the
    per-row ``policy`` then in the contract's output form without its last axis).
    """
    prelude, source = array_source(arrays_file, dtype)
    lines = [
        "import numpy as np, ml_dtypes",
        "from attention_conformance.implementations import load_implementation",
        "from attention_conformance.conformance import oracle",
        *prelude,
        f"impl = load_implementation({impl_spec!r})",
    ]
    arrays, options = {}, {}
    for name, value in inputs.items():
        if isinstance(value, dict):
            lines.append(f"{name} = {{")
            lines += [f"    {key!r}: {source(name, key, item, dtype)}," for key, item in value.items()]
            lines.append("}")
            arrays[name] = name
        elif isinstance(value, np.ndarray):
            lines.append(f"{name} = {source(name, None, value, _own_dtype(name, value, dtype))}")
            arrays[name] = name
        else:
            options[name] = value
    array_args = ", ".join(f"{k!r}: {k}" for k in arrays)
    output_layout = output_layout or layout
    if layout != "bhld":
        lines.append(f"# impl.call hands q, k, v to the implementation as LAYOUT {layout!r} (B, L, H, D), contiguous")
    if output_layout != "bhld":
        lines.append(f"# impl.call reads its output as {output_layout!r} (B, L, H, D) and transposes it to (B, H, L, D)")
    lines.append(f"got = impl.call({op!r}, {{{array_args}}}, {options!r}, device={device!r})")
    oracle_args = ", ".join(f"{k}={k}" for k in arrays) + "".join(f", {k}={v!r}" for k, v in options.items())
    if alignment is not None:
        oracle_args += f", alignment={alignment!r}"
    rows = op in ("sdpa", "sdpa_varlen", "sdpa_paged")  # operations with fully masked rows under a policy
    if rows and isinstance(policy, str):
        oracle_args += f", fully_masked_rows_policy={policy!r}"
    if rows and not isinstance(policy, str):  # each fully masked row under the policy of its own cause
        lines.append(f"policy = np.array({np.asarray(policy).tolist()!r})[..., None]")
        lines.append(f"want = sum(np.where(policy == p, oracle.{op}(" + oracle_args
                     + ", fully_masked_rows_policy=p), 0.0) for p in ('zeros', 'nan', 'uniform'))")
    else:
        lines.append(f"want = oracle.{op}({oracle_args})")
    # NaN where the oracle is NaN (a fully masked row under policy "nan") is agreement; any other NaN or
    # inf is reported, not skipped (np.nanmax would hide exactly the failures of sdpa.finite).
    lines += [
        "got = got.astype(np.float64)",
        "agree = (got == want) | (np.isnan(got) & np.isnan(want))",
    ]
    if op == "sdpa" and "query_lengths" in arrays:  # padding rows (sdpa.varlen) are not judged
        lines.append("agree |= ~np.broadcast_to(oracle.judged_rows(q, query_lengths)[..., None], got.shape)")
    lines += [
        "print('max abs error', np.max(np.where(agree, 0.0, np.abs(got - want)), initial=0.0))",
        "print('non-finite where the oracle is finite', int((~np.isfinite(got) & np.isfinite(want) & ~agree).sum()))",
    ]
    return "\n".join(lines)


def describe_clause(clause_id: str) -> str:
    clause = clauses().get(clause_id)
    return f"{clause_id}: {clause.statement}" if clause else clause_id


def failure_message(
    *,
    clause: str,
    impl_name: str,
    case_label: str,
    op: str,
    dtype: str,
    device: str,
    shapes: dict[str, tuple[int, ...]],
    mask_kind: str,
    problem: str,
    worst: str = "",
    repro_command: str = "",
) -> str:
    shape_text = ", ".join(f"{k}{tuple(v)}" for k, v in shapes.items())
    parts = [
        f"[{clause}] {impl_name} {op} on {device}/{dtype}, case {case_label}",
        f"  clause   {describe_clause(clause)}",
        f"  shapes   {shape_text}; mask {mask_kind}",
        f"  problem  {problem}",
    ]
    if worst:
        parts.append(f"  worst    {worst}")
    if repro_command:
        parts.append("  " + REPRO_HEADING)
        parts.append("    " + repro_command)
    return "\n".join(parts)

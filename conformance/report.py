"""Verdict messages, copy-pasteable repros, and the per-case records kept for the report."""
from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

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

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: non-finite figures (an infinite ratio, say) become null."""
        data = asdict(self)
        for key in ("max_abs_error", "allowed", "ratio"):
            if data[key] is not None and not np.isfinite(data[key]):
                data[key] = None
        return data


class ConformanceFailure(AssertionError):
    """A verdict against an implementation. ``clause`` is the clause it breaks."""

    def __init__(self, clause: str, message: str, record: CaseRecord | None = None):
        self.clause = clause
        self.record = record
        super().__init__(message)


def _array_literal(array: np.ndarray, dtype: str) -> str:
    if array.dtype == np.bool_:
        return f"np.array({array.tolist()!r}, dtype=bool)"
    values = np.asarray(array, dtype=np.float64).tolist()
    body = repr(values).replace("inf", "np.inf").replace("nan", "np.nan")
    if dtype == "bfloat16":
        return f"np.array({body}).astype(ml_dtypes.bfloat16)"
    return f"np.array({body}, dtype=np.{dtype})"


def repro(impl_spec: str, op: str, inputs: dict[str, Any], dtype: str, device: str, policy: str = "zeros") -> str:
    """A snippet that rebuilds the inputs, calls the implementation and prints its error against the oracle."""
    lines = [
        "import numpy as np, ml_dtypes",
        "from implementations import load_implementation",
        "from conformance import oracle",
        f"impl = load_implementation({impl_spec!r})",
    ]
    arrays, options = {}, {}
    for name, value in inputs.items():
        if isinstance(value, dict):
            lines.append(f"{name} = {{")
            lines += [f"    {key!r}: {_array_literal(item, dtype)}," for key, item in value.items()]
            lines.append("}")
            arrays[name] = name
        elif isinstance(value, np.ndarray):
            lines.append(f"{name} = {_array_literal(value, dtype)}")
            arrays[name] = name
        else:
            options[name] = value
    array_args = ", ".join(f"{k!r}: {k}" for k in arrays)
    lines.append(f"got = impl.call({op!r}, {{{array_args}}}, {options!r}, device={device!r})")
    oracle_args = ", ".join(f"{k}={k}" for k in arrays) + "".join(f", {k}={v!r}" for k, v in options.items())
    if op == "sdpa":
        oracle_args += f", fully_masked_rows_policy={policy!r}"
    lines.append(f"want = oracle.{op}({oracle_args})")
    # NaN where the oracle is NaN (a fully masked row under policy "nan") is agreement; any other NaN or
    # inf is reported, not skipped (np.nanmax would hide exactly the failures of sdpa.finite).
    lines += [
        "got = got.astype(np.float64)",
        "agree = (got == want) | (np.isnan(got) & np.isnan(want))",
        "print('max abs error', np.max(np.where(agree, 0.0, np.abs(got - want)), initial=0.0))",
        "print('non-finite where the oracle is finite', int((~np.isfinite(got) & np.isfinite(want)).sum()))",
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
    snippet: str = "",
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
    if snippet:
        parts.append("  repro (run from the repository root):")
        parts.append(textwrap.indent(snippet, "    "))
    return "\n".join(parts)

"""The record of every judged case (RECORDS) and how records are kept, compared and reduced to distinct cases.

A record holds figures to FIGURE_DIGITS significant digits and, in the report, its message without the repro
command where another record of the same test carries it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np


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
    repro_id: str = ""  # a failure whose repro file was saved (conformance/judging/evidence.py): its ID

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


RECORDS: list[CaseRecord] = []  # every judged case of the session, for the report


def _worst_ratio(rec: CaseRecord) -> float:
    return -1.0 if rec.ratio is None or rec.ratio != rec.ratio else float(rec.ratio)


FIGURE_DIGITS = 6


# The line before a failure's repro command (conformance/judging/evidence.py): --impl modules import from that
# directory.
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

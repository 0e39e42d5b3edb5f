"""The verdict on a sequence-parallel case: what every device returned, gathered into the global sequence, against
the single-device float64 sdpa of that sequence (conformance/reference/sequence_parallel.py).

``SequenceParallelVerdicts.finding`` looks at one gathered result and returns its first problem, or None: the
contract's form (q's dtype for the output, float32 or float64 for lse), no NaN or inf where the oracle is finite,
the output within sdpa's allowed error plus the merges' term, lse within its log-space allowance and -inf exactly
where the oracle's is, and in a gradient case dq, dk, dv and dsink (the devices' shares summed) within sdpa_backward's
allowance plus what the lse's cotangent and the merges add. The harness (conformance/harness/sequence_parallel.py)
runs the case, asks for the finding, names the clause at fault and words the failure through ``Judge.fail``, so
that it prints the suite's failure block with its repro.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attention_conformance.conformance.cases.case import Case, widen
from attention_conformance.conformance.judging.gradients import backward_allowed
from attention_conformance.conformance.judging.verdict import Judge, exceeds_allowed
from attention_conformance.conformance.reference import oracle
from attention_conformance.conformance.reference import sequence_parallel as reference
from attention_conformance.implementations.sequence_parallel import shard_positions

LSE_DTYPES = ("float32", "float64")  # the contract's float32; float64 accepted


GRADIENTS = ("dq", "dk", "dv", "dsink")


@dataclass
class Expected:
    """The oracle's answer to one case and its allowances, each computed once."""

    att: oracle.Attention
    out: np.ndarray
    out_allowed: np.ndarray
    lse: np.ndarray
    lse_allowed: np.ndarray
    grads: dict | None = None
    grads_allowed: dict | None = None


@dataclass
class Finding:
    """The first problem of a result: ``kind`` is "output", "lse", "gradient" (values off, the clause to be named
    by attribution for "output") or "contract" (``clause`` fixed); ``problem`` and ``worst`` as Judge.fail takes them,
    and the worst element's figures."""

    kind: str
    problem: str
    worst: str = ""
    clause: str | None = None
    error: float | None = None
    allowed: float | None = None
    ratio: float | None = None


def where_held(index: tuple, world: int, layout: str, length: int) -> str:
    """How a verdict names one element (b, h, i, ...) of the gathered sequence: its index and which device held
    position i, as which row of its shard."""
    position = int(index[2])
    for rank in range(world):
        held = shard_positions(length, world, layout, rank)
        rows = np.flatnonzero(held == position)
        if rows.size:
            return f"index {tuple(int(i) for i in index)} (position {position}: device {rank}'s row {int(rows[0])})"
    return f"index {tuple(int(i) for i in index)}"


def _compare(got: np.ndarray, want: np.ndarray, allowed: np.ndarray):
    """(error, ratio, worst index) of a result against the oracle; NaN or inf counts as an infinite error."""
    allowed = np.broadcast_to(allowed, want.shape)
    same_infinity = np.isinf(want) & (got == want)
    error = np.where(same_infinity, 0.0, np.abs(got - np.where(np.isfinite(want), want, 0.0)))
    error = np.where(np.isnan(error) | (np.isinf(want) & ~same_infinity), np.inf, error)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(allowed > 0, error / np.where(allowed > 0, allowed, 1.0), np.where(error > 0, np.inf, 0.0))
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
    return error, ratio, worst, allowed


class SequenceParallelVerdicts(Judge):
    """A Judge of sdpa_sequence_parallel: the oracle, the allowances and the first problem of a result."""

    def expected(self, case: Case, inputs: dict) -> Expected:
        """The oracle's answer to the case on its rounded inputs (computed once per inputs object)."""
        cached = getattr(self, "_expected_of", None)
        if cached is not None and cached[0] is inputs:
            return cached[1]
        wide = widen(inputs)
        att = reference.attention(wide)
        lse = att.lse()  # the sink counted once (lse.definition)
        found = Expected(att, att.output(), reference.output_allowed(att, wide, self.dtype, lse), lse,
                         reference.lse_allowed(att, wide, self.dtype, lse))
        if wide.get("d_out") is not None:
            found.grads = reference.gradients(wide)
            options = reference.options(wide)
            variants = {name: options[name] for name in ("window", "learnable_sink") if name in options}
            allowed = backward_allowed(wide["q"], wide["k"], wide["v"], wide["d_out"], None,
                                       options.get("is_causal", False), options.get("scale"), self.dtype, **variants)
            extra = reference.gradient_terms(wide, self.dtype, att, lse)
            found.grads_allowed = {name: allowed[name] + extra[name] for name in found.grads}
        self._expected_of = (inputs, found)
        return found

    def element(self, case: Case, inputs: dict, index: tuple) -> str:
        if case.op != "sdpa_sequence_parallel" or len(index) < 3:
            return super().element(case, inputs, index)
        return where_held(index, inputs["world_size"], inputs["sequence_layout"], inputs["q"].shape[2])

    def finding(self, case: Case, inputs: dict, result: dict) -> Finding | None:
        """The first problem of ``result`` (the gathered output, its dtype, lse and gradients), or None."""
        want = self.expected(case, inputs)
        expected_dtype = self.impl.output_dtype(self.dtype)
        if result["out_dtype"] != expected_dtype:
            return Finding("contract", f"output dtype {result['out_dtype']}, expected {expected_dtype} (q's dtype)",
                           clause="sp.definition")
        if inputs.get("return_lse") and result["lse_dtype"] not in LSE_DTYPES:
            return Finding("contract", f"lse dtype {result['lse_dtype']}, expected float32 (the contract's; float64 "
                           "accepted)", clause="sp.lse")
        found = self._values("output", case, inputs, result["out"], want.out, want.out_allowed)
        if found or not inputs.get("return_lse"):
            return found
        found = self._lse(case, inputs, result["lse"], want)
        if found or want.grads is None:
            return found
        for name in GRADIENTS:
            if name not in want.grads:
                continue
            if result.get(name) is None:
                what = "the learnable sink" if name == "dsink" else name[1]
                return Finding("gradient", f"{name} is None: no gradient reached {what}")
            found = self._values("gradient", case, inputs, result[name], want.grads[name], want.grads_allowed[name],
                                 name)
            if found:
                return found
        return None

    def worst_ratio(self, case: Case, inputs: dict, result: dict) -> tuple[float, float, float]:
        """(largest error, allowed error at the worst element, its ratio) over everything the case judged."""
        want = self.expected(case, inputs)
        pairs = [(result["out"], want.out, want.out_allowed)]
        if inputs.get("return_lse"):
            pairs.append((result["lse"], want.lse, want.lse_allowed))
        for name in GRADIENTS if want.grads else ():
            if name in want.grads:
                pairs.append((result[name], want.grads[name], want.grads_allowed[name]))
        best = (0.0, 0.0, 0.0)
        for got, expected, allowed in pairs:
            error, ratio, worst, allowed = _compare(got, expected, allowed)
            if ratio.size and ratio[worst] >= best[2]:
                best = (float(error.max()), float(allowed[worst]), float(ratio[worst]))
        return best

    # ---------------------------------------------------------------- checks
    def _values(self, kind: str, case: Case, inputs: dict, got, want, allowed, name: str = "output"):
        got = np.asarray(got, np.float64)
        if got.shape != want.shape:
            return Finding("contract", f"{name} of shape {got.shape} gathered, expected {want.shape}",
                           clause="sp.definition" if kind == "output" else "sp.gradients")
        error, ratio, worst, allowed = _compare(got, want, allowed)
        if not ratio.size or ratio[worst] <= 1.0:
            return None
        index = tuple(int(i) for i in worst)
        at = self.element(case, inputs, index) if got.ndim >= 3 else f"index {index}"
        bad = ~np.isfinite(got) & np.isfinite(want)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            where = self.element(case, inputs, first) if got.ndim >= 3 else f"index {first}"
            return Finding(kind, f"{int(bad.sum())} non-finite {name} element(s) where the oracle is finite",
                           f"{where}: got {got[first]}, oracle {want[first]:.9g}", error=float("inf"),
                           allowed=float(allowed[first]), ratio=float("inf"))
        words = exceeds_allowed(error[worst], allowed[worst], ratio[worst], f"{self.dtype} tolerance",
                                float(np.max(error)))
        return Finding(kind, f"{name}: {words}" if name != "output" else words,
                       f"{at}: got {got[worst]:.9g}, oracle {want[worst]:.9g}", error=float(error[worst]),
                       allowed=float(allowed[worst]), ratio=float(ratio[worst]))

    def _lse(self, case: Case, inputs: dict, got, want: Expected) -> Finding | None:
        got = np.asarray(got, np.float64)
        if got.shape != want.lse.shape:
            return Finding("contract", f"lse of shape {got.shape} gathered, expected {want.lse.shape} (B, Hq, L)",
                           clause="sp.lse")
        empty = np.isneginf(want.lse)
        wrong_empty = (empty & ~np.isneginf(got)) | (~empty & np.isneginf(got))
        if wrong_empty.any():
            first = tuple(int(i) for i in np.argwhere(wrong_empty)[0])
            return Finding("lse", f"{int(wrong_empty.sum())} lse row(s) -inf where the oracle's is not, or not -inf "
                           "where the row has nothing in its denominator",
                           f"{self.element(case, inputs, first)}: got {got[first]}, oracle {want.lse[first]}")
        return self._values("lse", case, inputs, got, want.lse, want.lse_allowed, "lse")

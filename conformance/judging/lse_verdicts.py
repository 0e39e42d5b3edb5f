"""Judging the log-sum-exp a call returns beside its output (return_lse=True; clauses lse.*; docs/contract.md, "The
log-sum-exp").

With return_lse=True, sdpa, sdpa_varlen and sdpa_paged return (out, lse): the output, judged as any other, and lse,
each query row's log of the softmax's denominator: (B, Hq, Lq) for sdpa and sdpa_paged, (Hq, total_q) for
sdpa_varlen (FlashAttention's packed layout), float32 (float64 accepted). The oracle's lse (expected.Reference.lse,
natural log) is put in the implementation's declared LSE_CONVENTION (its base, its value for a row without keys,
whether a learnable sink's term is counted) and compared row by row under the tolerance model's allowance in log
space (tolerances.lse_allowed): a finite row within its allowance, a row without keys exactly the declared value.
Padding rows (query_lengths) are not judged, as for the output.
"""
from __future__ import annotations

import math

import numpy as np

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.containment import RESULT_CLAUSE, is_array
from attention_conformance.conformance.judging.expected import reference
from attention_conformance.conformance.judging.verdict import Judge, exceeds_allowed
from attention_conformance.implementations.arrays import ARRAY_KINDS, dtype_name

LSE_OPS = ("sdpa", "sdpa_varlen", "sdpa_paged")
SHAPE_CLAUSE = "lse.shape-dtype"
EMPTY_ROW_CLAUSE = "lse.fully-masked-row"
EMPTY_ROW_VALUES = {"-inf": -np.inf, "+inf": np.inf, "0": 0.0, "nan": np.nan}
# The output of an lse case is judged under its operation's definition clause; the lse under the case's own.
OUTPUT_CLAUSES = {"sdpa": "sdpa.definition", "sdpa_varlen": "varlen.definition", "sdpa_paged": "paged.definition"}


def with_lse(case: Case, clauses: tuple[str, ...] | None = None) -> Case:
    """The case asking for the lse too (return_lse=True), filed under ``clauses`` (the case's own by default)."""
    return Case(case.op, {**case.inputs, "return_lse": True}, clauses or case.clauses, case.label, case.mask_kind,
                case.notes)


def without_lse(inputs: dict) -> dict:
    """The inputs of the same call asking for the output alone."""
    return {name: value for name, value in inputs.items() if name != "return_lse"}


class LseJudge(Judge):
    """A Judge of cases that ask for (out, lse): the output judged as always, the lse against the oracle's."""

    lse: np.ndarray | None = None  # the latest call's lse, float64, in the judge's form (sdpa_varlen: (1, Hq, total_q))

    def _check_contract(self, case: Case, inputs: dict, got) -> np.ndarray:
        """(out, lse): a pair, the output as any output, lse an array of float32 or float64 of the contract's shape."""
        __tracebackhide__ = True
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            self.fail(RESULT_CLAUSE, case, inputs,
                      f"returned {type(got).__name__}, expected a pair (out, lse): the case passes return_lse=True")
        out, lse = got
        out = super()._check_contract(case, inputs, out)
        want = self.lse_shape(case, inputs)
        if not is_array(lse):
            self.fail(SHAPE_CLAUSE, case, inputs, f"returned lse as {type(lse).__name__}, expected an array of shape "
                                                  f"{want}")
        lse = lse if isinstance(lse, np.ndarray) else ARRAY_KINDS[self.impl.array].to_numpy(lse)
        if lse.shape != want:
            self.fail(SHAPE_CLAUSE, case, inputs, f"lse shape {lse.shape}, expected {want} "
                                                  f"({'(Hq, total_q)' if case.op == 'sdpa_varlen' else '(B, Hq, Lq)'})")
        if dtype_name(lse.dtype) not in ("float32", "float64"):
            self.fail(SHAPE_CLAUSE, case, inputs, f"lse dtype {dtype_name(lse.dtype)}, expected float32 (or float64)")
        self.lse = lse.astype(np.float64)[None] if case.op == "sdpa_varlen" else lse.astype(np.float64)
        return out

    def lse_shape(self, case: Case, inputs: dict) -> tuple[int, ...]:
        """The contract's lse shape: (B, Hq, Lq), or (Hq, total_q) for sdpa_varlen."""
        rows = reference(case, inputs, self.alignment).lse().shape
        return rows[1:] if case.op == "sdpa_varlen" else rows

    def expected_lse(self, case: Case, inputs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the oracle's lse in the declared LSE_CONVENTION, its allowed error, the rows without keys), in the judge's
        form."""
        convention = self.impl.lse_convention
        ref = reference(case, inputs, self.alignment)
        want = ref.lse(convention["sink"])
        allowed = ref.lse_allowed(self.dtype, self.tf32, convention["sink"])
        keyless = np.isneginf(want)
        if convention["base"] == "2":
            want, allowed = want / math.log(2.0), allowed / math.log(2.0)
        if convention["empty_row"] in EMPTY_ROW_VALUES:
            want = np.where(keyless, EMPTY_ROW_VALUES[convention["empty_row"]], want)
        return want, allowed, keyless

    def judged_lse_rows(self, case: Case, inputs: dict, shape: tuple[int, ...]) -> np.ndarray:
        """The rows an lse verdict looks at: not padding (query_lengths), and not a row without keys whose value
        LSE_CONVENTION leaves unspecified."""
        rows = np.ones(shape, dtype=bool)
        if case.op == "sdpa":
            rows = rows & np.broadcast_to(self.judged_rows(case, inputs), shape)
        return rows

    def judge_lse(self, case: Case, inputs: dict, clause: str | None = None):
        """The latest call's lse against the oracle's: each finite row within its allowance, each row without keys
        exactly the declared value (NaN only where declared "nan")."""
        __tracebackhide__ = True
        clause = clause or case.clauses[0]
        if clause == EMPTY_ROW_CLAUSE:  # a case drawn for rows without keys: its other rows' values are the definition's
            clause = "lse.definition"
        got = self.lse
        want, allowed, keyless = self.expected_lse(case, inputs)
        judged = self.judged_lse_rows(case, inputs, want.shape)
        if self.impl.lse_convention["empty_row"] == "unspecified":
            judged = judged & ~keyless
        base = "" if self.impl.lse_convention["base"] == "e" else " (base 2, as declared)"
        finite = np.isfinite(want)
        wrong_value = judged & ~finite & ~((got == want) | (np.isnan(got) & np.isnan(want)))
        if wrong_value.any():
            index = tuple(int(i) for i in np.argwhere(wrong_value)[0])
            empty = bool(keyless[index])
            declared = self.impl.lse_convention["empty_row"]
            self.fail(EMPTY_ROW_CLAUSE if empty else clause, case, inputs,
                      f"{int(wrong_value.sum())} lse row(s) {'without keys' if empty else ''} are not "
                      f"{'the declared ' + declared if empty else 'the oracle value'}{base}",
                      f"{self.lse_row(case, inputs, index)}: got {got[index]:.9g}, oracle {want[index]:.9g}",
                      attribute=False)
        self._judge_base(case, inputs, got, want, allowed, judged & finite)
        lost = judged & finite & ~np.isfinite(got)
        if lost.any():
            index = tuple(int(i) for i in np.argwhere(lost)[0])
            self.fail(clause, case, inputs, f"{int(lost.sum())} non-finite lse row(s) where the oracle's is finite",
                      f"{self.lse_row(case, inputs, index)}: got {got[index]:.9g}, oracle {want[index]:.9g}",
                      attribute=False)
        with np.errstate(invalid="ignore"):  # rows without keys (inf - inf) are judged above
            error = np.where(judged & finite, np.abs(got - np.where(finite, want, 0.0)), 0.0)
        ratio = np.where(allowed > 0, error / np.where(allowed > 0, allowed, 1.0), np.where(error > 0, np.inf, 0.0))
        worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
        figures = dict(max_abs_error=float(error.max()) if error.size else 0.0,
                       allowed=float(allowed[worst]) if ratio.size else 0.0,
                       ratio=float(ratio[worst]) if ratio.size else 0.0)
        record = self.new_record(case, clause, "passed", **figures)
        if ratio.size and ratio[worst] > 1.0:
            self.fail(clause, case, inputs,
                      "lse " + exceeds_allowed(error[worst], allowed[worst], ratio[worst],
                                               f"{self.dtype} lse tolerance", figures["max_abs_error"]) + base,
                      f"{self.lse_row(case, inputs, tuple(int(i) for i in worst))}: got {got[worst]:.9g}, "
                      f"oracle {want[worst]:.9g}", record=record, attribute=False)
        self.record(case, clause, "passed", **figures)

    def _judge_base(self, case: Case, inputs: dict, got, want, allowed, rows) -> None:
        """An lse off its allowance that is, row for row, the oracle's in the other base: lse.base, saying which."""
        __tracebackhide__ = True
        if not rows.any():
            return
        with np.errstate(invalid="ignore", over="ignore"):
            off = np.abs(got - want) > allowed
            if not (off & rows).any():
                return
            declared = self.impl.lse_convention["base"]
            factor = 1.0 / math.log(2.0) if declared == "e" else math.log(2.0)  # what the other base multiplies by
            other = np.abs(got - want * factor) <= allowed * max(factor, 1.0)
        if not other[rows].all():
            return
        index = tuple(int(i) for i in np.argwhere(off & rows)[0])
        found = "2" if declared == "e" else "e"
        self.fail("lse.base", case, inputs,
                  f"every judged lse row is the oracle's in base {found} (x {factor:.6g}), not base {declared}: "
                  f"declare LSE_CONVENTION {{'base': '{found}'}} if that is the intended convention",
                  f"{self.lse_row(case, inputs, index)}: got {got[index]:.9g}, oracle {want[index]:.9g} "
                  f"(base {found}: {want[index] * factor:.9g})", attribute=False)

    def lse_row(self, case: Case, inputs: dict, index: tuple) -> str:
        """How a verdict names one lse row: its index, and for sdpa_varlen its index of (Hq, total_q)."""
        if case.op == "sdpa_varlen" and len(index) == 3:
            return f"lse row {(int(index[1]), int(index[2]))} of (Hq, total_q)"
        return f"lse row {index}"

    def check(self, case: Case, clause: str | None = None) -> tuple[np.ndarray, dict]:
        """Run once; judge the output under its operation's definition clause and the lse under the case's own."""
        __tracebackhide__ = True
        got, inputs = self.run(case)
        # The output drawn for its definition clause and attributed as any output is (its probes call without
        # return_lse): a fault that the case passes without one of its keywords is that keyword's (a window's right
        # edge of 0 read as unbounded was filed under sdpa.definition here).
        output = Case(case.op, without_lse(case.inputs), (OUTPUT_CLAUSES[case.op],), case.label, case.mask_kind,
                      case.notes)
        self.judge(output, got, inputs)
        self.judge_lse(case, inputs, clause)
        return got, inputs

    def _snippet(self, case: Case, inputs: dict, arrays_file: str | None = None) -> str:
        """The output's script (Judge._snippet, on the inputs without return_lse), then, for sdpa, the lse's: the call
        with return_lse=True against the oracle's lse in the declared convention."""
        text = super()._snippet(case, without_lse(inputs), arrays_file)
        if case.op != "sdpa":
            return text + "\n# the lse of this case: `attention-conformance repro ID` replays its verdict"
        arrays = [n for n, x in inputs.items() if isinstance(x, (np.ndarray, dict))]
        options = {n: x for n, x in inputs.items() if n not in arrays}
        convention = self.impl.lse_convention
        oracle_args = ", ".join(f"{n}={n}" for n in arrays) + "".join(
            f", {n}={x!r}" for n, x in options.items() if n != "return_lse")
        lines = [text,
                 f"got_out, got_lse = impl.call('sdpa', {{{', '.join(f'{n!r}: {n}' for n in arrays)}}}, "
                 f"{options!r}, device={self.device!r})",
                 f"want_lse = oracle.attention({oracle_args}).lse({convention['sink']!r})",
                 "empty = np.isneginf(want_lse)"]
        if convention["base"] == "2":
            lines.append("want_lse = want_lse / np.log(2.0)  # LSE_CONVENTION base 2")
        lines += ["print('max abs error of the lse', np.max(np.where(empty, 0.0, np.abs(got_lse - want_lse)), "
                  "initial=0.0))",
                  f"print('lse of rows without keys', got_lse[empty], 'declared', {convention['empty_row']!r})"]
        return "\n".join(lines)

    def replay(self, case: Case) -> None:
        __tracebackhide__ = True
        self.check(case)

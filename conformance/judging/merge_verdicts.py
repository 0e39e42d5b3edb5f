"""Judging merge_states: the merged (out, lse) of P partial states against their exact merge (clauses merge.*;
docs/contract.md, "Merging partial states").

The parts reach the implementation as its own sdpa would hand them over: out_p in the dtype under test, lse_p float32
(float64 in float64 cases) in its declared LSE_CONVENTION's base, a part without keys at -inf (+inf where the
convention's empty_row is "+inf", FlashAttention 2's). The oracle merges the very parts given (their roundings are
the sdpa's, judged there), so the allowance is the merge's own arithmetic (conformance/reference/merge_tolerance.py).
A row without any key (nor a sink) must merge to out 0 and lse the declared empty value, exactly.
"""
from __future__ import annotations

import math

import numpy as np

from attention_conformance.conformance.cases.case import Case, widen
from attention_conformance.conformance.judging.containment import RESULT_CLAUSE, is_array
from attention_conformance.conformance.judging.lse_verdicts import EMPTY_ROW_VALUES
from attention_conformance.conformance.judging.messages import array_source, own_dtype
from attention_conformance.conformance.judging.verdict import Judge, exceeds_allowed
from attention_conformance.conformance.reference import merging
from attention_conformance.conformance.reference.merge_tolerance import merge_allowed
from attention_conformance.implementations.arrays import ARRAY_KINDS, dtype_name

SHAPE_CLAUSE = "merge.shape-dtype"
EMPTY_CLAUSE = "merge.empty-part"


class MergeJudge(Judge):
    """A Judge of merge_states cases: the parts put in the declared convention, the pair checked, both halves
    judged against the exact merge."""

    lse: np.ndarray | None = None  # the latest call's merged lse, float64, as returned (declared base)

    # ------------------------------------------------------------- the parts as given
    def empty_input(self) -> float:
        """The lse a part without keys is handed over with: -inf, or +inf under LSE_CONVENTION empty_row '+inf'."""
        return np.inf if self.impl.lse_convention["empty_row"] == "+inf" else -np.inf

    def merge_inputs(self, case: Case) -> dict:
        """The case's inputs as the implementation gets them: out rounded to the dtype, lse in the declared base
        rounded to float32 (float64 in float64 cases), an empty part's lse the declared marker."""
        inputs = case.rounded(self.dtype)
        natural = np.asarray(case.inputs["lse"], dtype=np.float64)
        lse = natural / math.log(2.0) if self.impl.lse_convention["base"] == "2" else natural
        lse = np.where(np.isneginf(natural), self.empty_input(), lse)
        inputs["lse"] = lse.astype(np.float64 if self.dtype == "float64" else np.float32)
        return inputs

    def run(self, case: Case, inputs: dict | None = None) -> tuple[np.ndarray, dict]:
        return super().run(case, self.merge_inputs(case) if inputs is None else inputs)

    def expected(self, inputs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(out, lse in the declared convention, out's allowed error, lse's allowed error, rows without keys)."""
        convention = self.impl.lse_convention
        parts = widen(inputs)
        lse_in = merging.natural_lse(parts["lse"], convention["base"], self.empty_input())
        sink = parts.get("learnable_sink")
        out, lse, weights = merging.merge_states(parts["out"], lse_in, sink)
        out_allowed, lse_allowed = merge_allowed(parts["out"], lse_in, out, lse, weights, self.dtype, sink)
        if sink is not None and convention["sink"] == "excluded":
            lse = merging.keys_lse_alone(lse_in)
        keyless = np.isneginf(lse)
        if convention["base"] == "2":
            lse, lse_allowed = lse / math.log(2.0), lse_allowed / math.log(2.0)
        if convention["empty_row"] in EMPTY_ROW_VALUES:
            lse = np.where(keyless, EMPTY_ROW_VALUES[convention["empty_row"]], lse)
        return out, lse, out_allowed, lse_allowed, keyless

    def _expected_shape(self, case: Case, inputs: dict) -> tuple[int, ...]:
        return tuple(np.shape(inputs["out"])[1:])

    # ------------------------------------------------------------- the result's form
    def _check_contract(self, case: Case, inputs: dict, got) -> np.ndarray:
        """(out, lse): out (B, Hq, Lq, Dv) in the parts' dtype, lse (B, Hq, Lq) float32 (float64 accepted)."""
        __tracebackhide__ = True
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            self.fail(RESULT_CLAUSE, case, inputs, f"returned {type(got).__name__}, expected a pair (out, lse)",
                      attribute=False)
        out, lse = got
        kind = ARRAY_KINDS[self.impl.array]
        want = self._expected_shape(case, inputs)
        for name, value, shape in (("out", out, want), ("lse", lse, want[:-1])):
            if not is_array(value):
                self.fail(SHAPE_CLAUSE, case, inputs, f"returned {name} as {type(value).__name__}, expected an array "
                                                      f"of shape {shape}", attribute=False)
            value = value if isinstance(value, np.ndarray) else kind.to_numpy(value)
            if value.shape != shape:
                self.fail(SHAPE_CLAUSE, case, inputs, f"{name} shape {value.shape}, expected {shape}", attribute=False)
            dtype = dtype_name(value.dtype)
            allowed = (self.dtype,) if name == "out" else ("float32", "float64")
            if dtype not in allowed:
                self.fail(SHAPE_CLAUSE, case, inputs, f"{name} dtype {dtype}, expected {' or '.join(allowed)}",
                          attribute=False)
            if name == "out":
                out = value
            else:
                self.lse = value.astype(np.float64)
        return out.astype(np.float64)

    # ------------------------------------------------------------- the verdict
    def judge_merge(self, case: Case, got: np.ndarray, inputs: dict) -> None:
        """out and lse against the exact merge: no NaN or inf where it is finite (a NaN in a row with an empty part
        is merge.empty-part's), each element within its allowance, rows without keys exact."""
        __tracebackhide__ = True
        clause = case.clauses[0]
        want, want_lse, allowed, lse_allowed, keyless = self.expected(inputs)
        has_empty_part = np.any(np.isneginf(merging.natural_lse(widen(inputs)["lse"],
                                                                self.impl.lse_convention["base"],
                                                                self.empty_input())), axis=0)
        # A NaN or inf where a part was empty, and any fault of a row no part has a key for, is merge.empty-part's;
        # values off elsewhere are the case's own clause's.
        row_clause = np.where(keyless, EMPTY_CLAUSE, clause)
        bad = ~np.isfinite(got)
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            self.fail(EMPTY_CLAUSE if has_empty_part[index[:-1]] else str(row_clause[index[:-1]]), case, inputs,
                      f"{int(bad.sum())} non-finite output element(s) where the merge is finite",
                      f"out index {index}: got {got[index]}, oracle {want[index]:.9g}{self._parts_of(inputs, index)}",
                      attribute=False)
        self._judge_values(case, inputs, "out", got, want, allowed, row_clause[..., None])
        convention = self.impl.lse_convention
        judged = np.ones(want_lse.shape, dtype=bool)
        if convention["empty_row"] == "unspecified":
            judged &= ~keyless
        exact = judged & ~np.isfinite(want_lse)
        wrong = exact & ~((self.lse == want_lse) | (np.isnan(self.lse) & np.isnan(want_lse)))
        if wrong.any():
            index = tuple(int(i) for i in np.argwhere(wrong)[0])
            self.fail(EMPTY_CLAUSE, case, inputs,
                      f"{int(wrong.sum())} merged lse row(s) without keys are not the declared "
                      f"{convention['empty_row']}",
                      f"lse row {index}: got {self.lse[index]:.9g}{self._parts_of(inputs, index)}", attribute=False)
        finite = judged & np.isfinite(want_lse)
        lost = finite & ~np.isfinite(self.lse)
        if lost.any():
            index = tuple(int(i) for i in np.argwhere(lost)[0])
            self.fail(EMPTY_CLAUSE if has_empty_part[index] else clause, case, inputs,
                      f"{int(lost.sum())} non-finite merged lse row(s) where the merge is finite",
                      f"lse row {index}: got {self.lse[index]}, oracle {want_lse[index]:.9g}"
                      f"{self._parts_of(inputs, index)}", attribute=False)
        self._judge_base(case, inputs, want_lse, lse_allowed, finite)
        self._judge_values(case, inputs, "lse", np.where(finite, self.lse, 0.0), np.where(finite, want_lse, 0.0),
                           lse_allowed, np.where(finite, row_clause, clause), finite)

    def _judge_values(self, case, inputs, name, got, want, allowed, clauses, judged=None) -> None:
        __tracebackhide__ = True
        with np.errstate(invalid="ignore"):
            error = np.abs(got - want)
        if judged is not None:
            error = np.where(judged, error, 0.0)
        error = np.where(np.isnan(error), np.inf, error)
        ratio = np.where(allowed > 0, error / np.where(allowed > 0, allowed, 1.0), np.where(error > 0, np.inf, 0.0))
        worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
        figures = dict(max_abs_error=float(error.max()) if error.size else 0.0,
                       allowed=float(allowed[worst]) if ratio.size else 0.0,
                       ratio=float(ratio[worst]) if ratio.size else 0.0)
        if ratio.size and ratio[worst] > 1.0:
            index = tuple(int(i) for i in worst)
            clause = str(np.broadcast_to(clauses, ratio.shape)[index])
            record = self.new_record(case, clause, "failed", **figures)
            base = " (base 2, as declared)" if name == "lse" and self.impl.lse_convention["base"] == "2" else ""
            self.fail(clause, case, inputs,
                      f"merged {name} " + exceeds_allowed(error[worst], allowed[worst], ratio[worst],
                                                          f"{self.dtype} merge tolerance", figures["max_abs_error"])
                      + base,
                      f"{name} index {index}: got {got[worst]:.9g}, oracle {want[worst]:.9g}"
                      f"{self._parts_of(inputs, index)}", record=record, attribute=False)
        self.record(case, case.clauses[0], "passed", **figures)

    def _judge_base(self, case: Case, inputs: dict, want_lse, lse_allowed, rows) -> None:
        """A merged lse that is, row for row, the exact one in the other base: lse.base, saying which."""
        __tracebackhide__ = True
        if not rows.any():
            return
        with np.errstate(invalid="ignore", over="ignore"):
            off = rows & (np.abs(self.lse - want_lse) > lse_allowed)
            declared = self.impl.lse_convention["base"]
            factor = 1.0 / math.log(2.0) if declared == "e" else math.log(2.0)
            other = np.abs(self.lse - want_lse * factor) <= lse_allowed * max(factor, 1.0) + 1e-6 * np.abs(want_lse)
        if not off.any() or not other[rows].all():
            return
        index = tuple(int(i) for i in np.argwhere(off)[0])
        found = "2" if declared == "e" else "e"
        self.fail("lse.base", case, inputs,
                  f"every merged lse row is the exact merge's in base {found} (x {factor:.6g}), not base {declared}",
                  f"lse row {index}: got {self.lse[index]:.9g}, oracle {want_lse[index]:.9g}", attribute=False)

    def _parts_of(self, inputs: dict, index: tuple) -> str:
        """What the parts of the row at ``index`` were: their lse as handed over (", parts' lse [...]")."""
        row = np.asarray(inputs["lse"])[(slice(None), *index[:3])]
        return f"; the parts' lse {np.array2string(row, precision=6, separator=', ')}"

    def check(self, case: Case, clause: str | None = None) -> tuple[np.ndarray, dict]:
        __tracebackhide__ = True
        got, inputs = self.run(case)
        self.judge_merge(case, got, inputs)
        return got, inputs

    def replay(self, case: Case) -> None:
        __tracebackhide__ = True
        self.check(case)

    def _snippet(self, case: Case, inputs: dict, arrays_file: str | None = None) -> str:
        """A standalone script: the parts as handed over, the call, the exact merge, the errors."""
        prelude, source = array_source(arrays_file, self.dtype)
        convention = self.impl.lse_convention
        lines = ["import numpy as np, ml_dtypes",
                 "from attention_conformance.implementations.registry import load_implementation",
                 "from attention_conformance.conformance.reference import merging", *prelude,
                 f"impl = load_implementation({self.impl.spec!r})"]
        arrays = [n for n, x in inputs.items() if isinstance(x, np.ndarray)]
        for name in arrays:
            lines.append(f"{name} = {source(name, None, inputs[name], own_dtype(name, inputs[name], self.dtype))}")
        if arrays_file is not None and (convention["base"] == "2" or self.empty_input() > 0):
            # the file holds the parts' lse as natural logs; the implementation takes them in its convention
            lines.append(f"lse = np.where(np.isneginf(lse), float({str(self.empty_input())!r}), lse"
                         f"{' / np.log(2.0)' if convention['base'] == '2' else ''}).astype(lse.dtype)")
        sink = "learnable_sink" if "learnable_sink" in arrays else "None"
        lines += [f"got_out, got_lse = impl.call('merge_states', {{{', '.join(f'{n!r}: {n}' for n in arrays)}}}, {{}}, "
                  f"device={self.device!r})",
                  f"parts_lse = merging.natural_lse(lse, {convention['base']!r}, float({str(self.empty_input())!r}))",
                  f"want_out, want_lse, _ = merging.merge_states(out.astype(np.float64), parts_lse, {sink})"]
        if convention["base"] == "2":
            lines.append("want_lse = want_lse / np.log(2.0)  # LSE_CONVENTION base 2")
        lines += ["print('max abs error of out', np.max(np.abs(got_out.astype(np.float64) - want_out), initial=0.0))",
                  "finite = np.isfinite(want_lse)",
                  "print('max abs error of lse', np.max(np.where(finite, np.abs(got_lse - want_lse), 0.0), "
                  "initial=0.0), 'rows without keys', got_lse[~finite])"]
        return "\n".join(lines)

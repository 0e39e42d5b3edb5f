"""The wording of a verdict: the failure message (clause, case, worst element, the error against the allowed error), the
copy-pasteable repro snippet of ``--print-python``, and ConformanceFailure, the exception that carries a verdict.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from attention_conformance.conformance.cases.case import DESCALES
from attention_conformance.conformance.judging.records import REPRO_HEADING, CaseRecord
from attention_conformance.conformance.specdata import clauses
from attention_conformance.implementations.arrays import is_eight_bit


class ConformanceFailure(AssertionError):
    """A verdict against an implementation. ``clause`` is the clause it breaks; ``evidence`` what its repro file
    holds (conformance/judging/evidence.py), from which the terminal's failure block is written (failure_block.py)."""

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

    Inline literals by default; with ``arrays_file`` (a repro's .npz, conformance/judging/evidence.py) the inputs are
    read from
    it and rounded to ``dtype`` as the run rounded them (Case.rounded), however large they are.
    """
    if arrays_file is None:
        return [], lambda name, key, array, own: _array_literal(array, own)
    prelude = ["from pathlib import Path",
               "from attention_conformance.conformance.harness import replay",
               f"inputs = replay.load(Path({arrays_file!r})).case.rounded({dtype!r})"]
    return prelude, lambda name, key, array, own: f"inputs[{name!r}]" + (f"[{key!r}]" if key is not None else "")


def own_dtype(name: str, value: np.ndarray, dtype: str) -> str:
    # Lengths (int32), ALiBi slopes, sink logits and merged states' lse (float32/float64) keep their own dtype
    # (docs/contract.md).
    own = value.dtype.kind in "iu" or name in ("alibi_slopes", "learnable_sink", "lse", *DESCALES)
    own = own or (name == "mask" and is_eight_bit(dtype))  # an 8-bit case's float mask: float32 (Case.rounded)
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
        "from attention_conformance.implementations.registry import load_implementation",
        "from attention_conformance.conformance.reference import oracle",
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
            lines.append(f"{name} = {source(name, None, value, own_dtype(name, value, dtype))}")
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

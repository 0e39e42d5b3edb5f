"""How a sequence-parallel case runs and is judged: on real process groups and host meshes
(conformance/harness/process_groups.py), against the gathered sequence's oracle
(conformance/judging/sequence_parallel.py), with the failing clause named by probes.

``SequenceParallelJudge.check(case)``:

1. reports the case unsupported (never failed) where the implementation cannot run it: an operation or keyword it
   lacks, a region it declares (SUPPORTS and supports(facts), of the gathered sequence's attention: ``region_facts``),
   its SEQUENCE_PARALLEL declaration, an ARRAY without process groups, a device other than the CPU;
2. runs it: ARRAY "torch" on the first N ranks of this process's rank pool, each given its shards; ARRAY "jax" in
   this process's JAX child, inside shard_map over its first N host devices; within the call time limit
   (--call-timeout; four times it for an implementation that compiles). A group that does not answer in time is
   killed and the case fails as a hang (contract.result-type), naming the ranks that did not answer; the
   implementation is then marked hung in this process, its later cases failing at once. NotImplementedError is
   unsupported; any other exception fails the clause the case was drawn for;
3. gathers every device's output, lse and gradients (the learnable sink's shares summed) and judges them. A
   gradient off is filed under sp.gradients; a value of the forward under the clause of the first of these probes
   that passes: the case contiguous instead of zigzag (sp.layout), cut to a length N divides (sp.uneven), on 2
   devices instead of N >= 3 (sp.ring-order), without its window and sink (sp.window-sink), with its kv heads
   repeated (sp.heads), not causal (sp.causal-blocks); else under sp.lse for an lse alone, sp.definition otherwise.

``sequence_parallel_property`` is the outermost decorator of the properties (conformance/test_sequence_parallel.py):
the property's corners, then random draws (none in the default profile for an implementation that compiles: each
case is an XLA compile of a program of N devices).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import settings
from hypothesis.errors import Unsatisfiable

from attention_conformance.conformance.cases import support
from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.sequence_parallel import (
    DrawingPlan,
    drawing_for,
    even_length_probe,
    even_world_probe,
    relabelled,
)
from attention_conformance.conformance.cases.support import SUPPORT_COUNTS, unsupported
from attention_conformance.conformance.harness import process_groups
from attention_conformance.conformance.harness.properties import bounded_failure, run_covering_set
from attention_conformance.conformance.judging.containment import COMPILED_CALL_ALLOWANCE, RESULT_CLAUSE
from attention_conformance.conformance.judging.messages import array_source, own_dtype
from attention_conformance.conformance.judging.sequence_parallel import Finding, SequenceParallelVerdicts
from attention_conformance.implementations.arrays import ARRAY_KINDS
from attention_conformance.implementations.region import variant_values
from attention_conformance.implementations.sequence_parallel import (
    DeclarationError,
    declaration_of,
    rank_order,
    shard,
)

OP = "sdpa_sequence_parallel"


PROCESS_ARRAYS = ("torch", "jax")  # the ARRAY kinds whose processes the suite can group


# Implementations that hung in this process: spec -> the case they hung on.
HUNG: dict[str, str] = {}


def keywords(inputs: dict) -> dict:
    """The keywords of the call beside the arrays and the group: those that are not their default."""
    found = {}
    if inputs.get("sequence_layout", "contiguous") != "contiguous":
        found["sequence_layout"] = inputs["sequence_layout"]
    if inputs.get("is_causal"):
        found["is_causal"] = True
    for name in ("scale", "window"):
        if inputs.get(name) is not None:
            found[name] = tuple(inputs[name]) if name == "window" else inputs[name]
    if inputs.get("return_lse"):
        found["return_lse"] = True
    return found


def region_facts(inputs: dict, dtype: str, device: str) -> dict:
    """The facts SUPPORTS and supports(facts) see of a case (docs/declarations.md, "Facts"): those of the attention
    every device computes a part of, the gathered sequence's (Lq = Lk = L), with the device count and layout."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    variants = tuple(name for name in ("learnable_sink", "window") if inputs.get(name) is not None)
    values = variant_values({name: inputs[name] for name in variants})
    return {"op": OP, "dtype": dtype, "device": device, "B": q.shape[0], "Hq": q.shape[1], "Hkv": k.shape[1],
            "Lq": q.shape[2], "Lk": k.shape[2], "Dk": q.shape[-1], "Dv": v.shape[-1],
            "is_causal": bool(inputs.get("is_causal")), "scale": inputs.get("scale"), "mask_kind": "none",
            "variants": tuple(sorted(variants)), "variant_values": values, "world_size": int(inputs["world_size"]),
            "sequence_layout": inputs["sequence_layout"]}


def applicability(impl) -> str | None:
    """Why the sequence-parallel properties do not apply to ``impl`` (None: they do). A SEQUENCE_PARALLEL that does
    not parse is an error naming the implementation, the key and the value."""
    if not impl.implements(OP):
        return None  # the op mark reports the operation missing
    if impl.array not in PROCESS_ARRAYS:
        return (f"not applicable: {impl.name} has ARRAY {impl.array!r}; sdpa_sequence_parallel runs on process "
                f"groups of ARRAY {' or '.join(map(repr, PROCESS_ARRAYS))}")
    try:
        declaration_of(impl)
    except DeclarationError as exc:
        raise pytest.UsageError(str(exc)) from None
    return None


class SequenceParallelJudge(SequenceParallelVerdicts):
    """Runs and judges sdpa_sequence_parallel cases of one implementation, dtype and device (module docstring)."""

    # ---------------------------------------------------------------- what cannot run
    def why_unsupported(self, case: Case, inputs: dict) -> str | None:
        call = {name: value for name, value in inputs.items() if name in ("sequence_layout", "is_causal", "scale",
                                                                          "window", "learnable_sink", "return_lse")}
        reason = self.impl.unsupported_reason(OP, call, self.dtype, self.device)
        if reason:
            return reason
        if self.impl.array not in PROCESS_ARRAYS:
            return applicability(self.impl)
        outside = self.impl.region.why_outside(region_facts(inputs, self.dtype, self.device))
        if outside:
            return f"outside {self.impl.name}'s declared region: {outside}"
        if self.device != "cpu":
            return (f"sequence-parallel cases run on the CPU (gloo ranks, JAX host devices) in this suite, not on "
                    f"{self.device}")
        declaration = declaration_of(self.impl)
        outside = declaration.why_outside(inputs["world_size"], inputs["sequence_layout"], inputs["q"].shape[2],
                                          inputs["q"].shape[1])
        if outside:
            return f"outside {self.impl.name}'s SEQUENCE_PARALLEL: {outside}"
        if inputs.get("d_out") is not None and not declaration.gradients:
            return f"{self.impl.name} declares no gradients (SEQUENCE_PARALLEL['gradients'] or GRADIENTS)"
        return None

    # ---------------------------------------------------------------- running
    def deadline(self) -> float:
        limit = self.call_limit() or 600.0
        return limit * (COMPILED_CALL_ALLOWANCE if self.impl.compiled else 1)

    def _message(self, inputs: dict, arrays: dict) -> dict:
        return {"spec": self.impl.spec, "size": int(inputs["world_size"]), "dtype": self.dtype, "arrays": arrays,
                "keywords": keywords(inputs), "return_lse": bool(inputs.get("return_lse")),
                "gradients": inputs.get("d_out") is not None,
                "check_vma": declaration_of(self.impl).check_vma}

    def execute(self, case: Case, inputs: dict) -> dict:
        """The gathered result of the case (out, lse, gradients, the dtypes); raises GroupFailure, or returns
        {"finding": Finding} when a device's result has the wrong shape."""
        if self.impl.array == "torch":
            return self._torch(case, inputs)
        return self._jax(case, inputs)

    def _torch(self, case: Case, inputs: dict) -> dict:
        world, layout = int(inputs["world_size"]), inputs["sequence_layout"]
        cut = {name: shard(inputs[name], world, layout) for name in ("q", "k", "v", "d_out")
               if inputs.get(name) is not None}
        if inputs.get("d_lse") is not None:
            cut["d_lse"] = [x[..., 0] for x in shard(inputs["d_lse"][..., None], world, layout)]
        messages = [self._message(inputs, {**{name: parts[r] for name, parts in cut.items()},
                                           "learnable_sink": inputs.get("learnable_sink")}) for r in range(world)]
        replies = process_groups.rank_pool().run(messages, self.deadline(), case.label)
        b, hq, _, _ = inputs["q"].shape
        dv = inputs["v"].shape[-1]
        for rank, reply in enumerate(replies):
            local = cut["q"][rank].shape[2]
            wrong = _shape_problem(reply, (b, hq, local, dv), (b, hq, local), rank)
            if wrong:
                return {"finding": wrong}
        gathered = {"out_dtype": replies[0]["out_dtype"], "lse_dtype": replies[0]["lse_dtype"]}
        for name in ("out", "dq", "dk", "dv"):
            if all(reply.get(name) is not None for reply in replies):
                gathered[name] = _gather(replies, name, layout)
        if replies[0]["lse"] is not None:
            gathered["lse"] = _gather([{"lse": r["lse"][..., None]} for r in replies], "lse", layout)[..., 0]
        if inputs.get("learnable_sink") is not None and all(r.get("dsink") is not None for r in replies):
            gathered["dsink"] = sum(reply["dsink"] for reply in replies)  # the devices' shares of a replicated input
        return gathered

    def _jax(self, case: Case, inputs: dict) -> dict:
        world, layout = int(inputs["world_size"]), inputs["sequence_layout"]
        order = rank_order(inputs["q"].shape[2], world, layout)
        arrays = {name: np.ascontiguousarray(inputs[name][:, :, order]) for name in ("q", "k", "v", "d_out", "d_lse")
                  if inputs.get(name) is not None}
        arrays["learnable_sink"] = inputs.get("learnable_sink")
        reply = process_groups.jax_child().run(self._message(inputs, arrays), self.deadline(), case.label)
        b, hq, length, _ = inputs["q"].shape
        wrong = _shape_problem(reply, (b, hq, length, inputs["v"].shape[-1]), (b, hq, length), None)
        if wrong:
            return {"finding": wrong}

        def in_place(x):
            out = np.empty_like(x)
            out[:, :, order] = x
            return out

        gathered = {"out_dtype": reply["out_dtype"], "lse_dtype": reply["lse_dtype"], "out": in_place(reply["out"])}
        if reply["lse"] is not None:
            gathered["lse"] = in_place(reply["lse"])
        for name in ("dq", "dk", "dv"):
            if reply.get(name) is not None:
                gathered[name] = in_place(reply[name])
        if reply.get("dsink") is not None:
            gathered["dsink"] = reply["dsink"]  # shard_map's transpose sums a replicated input's gradient already
        return gathered

    # ---------------------------------------------------------------- judging
    def check(self, case: Case, clause: str | None = None) -> tuple[dict, dict]:
        """Run the case and judge it (module docstring); returns the gathered result and the rounded inputs."""
        __tracebackhide__ = True
        inputs = case.rounded(self.dtype)
        reason = self.why_unsupported(case, inputs)
        if reason:
            self.record(case, case.clauses[0], "unsupported", message=reason)
            unsupported(reason)
        self._not_hung(case, inputs)
        outcome = self._outcome(case, inputs)
        SUPPORT_COUNTS["supported"] += 1
        finding = outcome.get("finding") or self.finding(case, inputs, outcome)
        if finding is not None:
            self._fail(case, inputs, finding)
        error, allowed, ratio = self.worst_ratio(case, inputs, outcome)
        self.record(case, clause or case.clauses[0], "passed", max_abs_error=error, allowed=allowed, ratio=ratio)
        return outcome, inputs

    def replay(self, case: Case) -> None:
        __tracebackhide__ = True
        self.check(case)

    def _not_hung(self, case: Case, inputs: dict) -> None:
        __tracebackhide__ = True
        earlier = HUNG.get(self.impl.spec)
        if earlier is not None:
            self.fail(RESULT_CLAUSE, case, inputs, f"{self.impl.name} hung earlier on case {earlier}: not run again in "
                      "this process, every later case fails at once", stop=_inside_hypothesis())

    def _outcome(self, case: Case, inputs: dict) -> dict:
        """The gathered result, or the verdict on a case whose processes did not all answer."""
        __tracebackhide__ = True
        try:
            return self.execute(case, inputs)
        except process_groups.GroupFailure as failure:
            statuses = {status for status, _ in failure.replies.values()}
            if failure.hung:
                HUNG[self.impl.spec] = case.label
                self.fail(RESULT_CLAUSE, case, inputs, f"the call hung: {failure} (--call-timeout "
                          f"{self.deadline():g} s for this implementation)", stop=_inside_hypothesis())
            if "unsupported" in statuses and statuses <= {"unsupported", "died"} and not failure.missing:
                reason = next(p for s, p in failure.replies.values() if s == "unsupported")
                self.record(case, case.clauses[0], "unsupported", message=reason)
                unsupported(f"{self.impl.name} raised {reason}")
            clause = RESULT_CLAUSE if "contract" in statuses else case.clauses[0]
            self.fail(clause, case, inputs, f"the implementation failed on its devices: {failure}", attribute=False)

    def passes(self, case: Case) -> bool:
        """Whether a probe (a case changed by one feature) runs and has no finding."""
        inputs = case.rounded(self.dtype)
        if self.why_unsupported(case, inputs):
            return False
        try:
            outcome = self.execute(case, inputs)
        except process_groups.GroupFailure:
            return False
        return outcome.get("finding") is None and self.finding(case, inputs, outcome) is None

    def blame(self, case: Case, finding: Finding) -> tuple[str, str]:
        """(the clause a finding of values is filed under, why): the first probe (the case without one feature)
        that passes names the feature; with none, the lse's clause for an lse alone, else the definition's."""
        if finding.kind == "gradient":
            return "sp.gradients", ""
        inputs = case.inputs
        probes = []  # most structural first: a window also exposes a wrong layout or ring order
        if inputs["sequence_layout"] == "zigzag":
            probes.append(("sp.layout", relabelled(case, "contiguous", sequence_layout="contiguous")))
        probes.append(("sp.uneven", even_length_probe(case)))
        probes.append(("sp.ring-order", even_world_probe(case, declaration_of(self.impl))))
        if inputs.get("window") is not None or inputs.get("learnable_sink") is not None:
            probes.append(("sp.window-sink", relabelled(case, "without its window and sink", window=None,
                                                        learnable_sink=None)))
        if inputs["k"].shape[1] < inputs["q"].shape[1]:
            group = inputs["q"].shape[1] // inputs["k"].shape[1]
            probes.append(("sp.heads", relabelled(case, "with its kv heads repeated to Hq",
                                                  k=np.repeat(inputs["k"], group, axis=1),
                                                  v=np.repeat(inputs["v"], group, axis=1))))
        if inputs.get("is_causal"):
            probes.append(("sp.causal-blocks", relabelled(case, "not causal", is_causal=False)))
        for clause, probe in probes:
            if probe is not None and self.passes(probe):
                return clause, f"; the same case passes {probe.label.rsplit('[', 1)[-1].rstrip(']')}"
        return ("sp.lse" if finding.kind == "lse" else "sp.definition"), ""

    def _fail(self, case: Case, inputs: dict, finding: Finding) -> None:
        __tracebackhide__ = True
        clause, why = (finding.clause, "") if finding.kind == "contract" else self.blame(case, finding)
        record = self.new_record(case, clause, "failed", max_abs_error=finding.error, allowed=finding.allowed,
                                 ratio=finding.ratio)
        self.fail(clause, case, inputs, finding.problem + why, finding.worst, record=record,
                  drawn_for=case.clauses[0], attribute=False)

    # ---------------------------------------------------------------- the repro script
    def _snippet(self, case: Case, inputs: dict, arrays_file: str | None = None) -> str:
        """A standalone script that runs the case on the implementation and prints the verdict."""
        prelude, source = array_source(arrays_file, self.dtype)
        lines = ["import numpy as np, ml_dtypes",
                 "from attention_conformance.conformance.harness.sequence_parallel import print_verdict", *prelude]
        entries = []
        for name, value in inputs.items():
            if isinstance(value, np.ndarray):
                lines.append(f"{name} = {source(name, None, value, own_dtype(name, value, self.dtype))}")
                entries.append(f"{name!r}: {name}")
            else:
                entries.append(f"{name!r}: {value!r}")
        lines.append(f"print_verdict({self.impl.spec!r}, {{{', '.join(entries)}}}, {self.dtype!r}, {self.device!r})")
        # The ranks come from a forkserver, which runs the main script again in each: everything under the guard.
        return "\n".join(lines[:2] + ["", 'if __name__ == "__main__":'] + ["    " + line for line in lines[2:]])


def _shape_problem(reply: dict, out_shape: tuple, lse_shape: tuple, rank: int | None) -> Finding | None:
    who = "" if rank is None else f"device {rank} "
    if reply["out"].shape != out_shape:
        return Finding("contract", f"{who}returned an output of shape {reply['out'].shape}, expected {out_shape} "
                       "(B, Hq, its positions, Dv)", clause="sp.definition")
    if reply["lse"] is not None and reply["lse"].shape != lse_shape:
        return Finding("contract", f"{who}returned lse of shape {reply['lse'].shape}, expected {lse_shape}",
                       clause="sp.lse")
    return None


def _gather(replies: list[dict], name: str, layout: str) -> np.ndarray:
    from attention_conformance.implementations.sequence_parallel import gather

    return gather([reply[name] for reply in replies], layout)


def _inside_hypothesis() -> bool:
    from hypothesis.control import currently_in_test_context

    return currently_in_test_context()


def print_verdict(spec: str, inputs: dict, dtype: str, device: str) -> None:
    """Run one case (inputs as a repro script writes them, already in ``dtype``) and print the verdict."""
    from attention_conformance.conformance.judging.messages import ConformanceFailure
    from attention_conformance.implementations.registry import load_implementation

    case = Case(OP, dict(inputs), ("sp.definition",), "a repro script's case")
    judge = SequenceParallelJudge(load_implementation(spec), dtype, device)
    try:
        judge.check(case)
    except ConformanceFailure as failure:
        print(f"FAILED {failure}")
    else:
        print("passed")
    finally:
        process_groups.close_all()


# ------------------------------------------------------------------ the properties
def random_examples(impl, profile_examples: int) -> int:
    """Random draws after the corners: none in the default profile (10) for an implementation that compiles, a
    tenth of the profile's less one otherwise (1 in ci, 9 in thorough); a third of the profile's, at least 2, for one
    that does not (3 in the default profile, 8 in ci, 33 in thorough)."""
    if impl.compiled:
        return max(0, profile_examples // 10 - 1)
    return max(2, profile_examples // 3)


def sequence_parallel_property(test=None, *, corners: tuple[dict, ...], requires=None):
    """Outermost decorator of a sequence-parallel property: its ``corners`` (hint dicts with an "index"; a compiling
    implementation runs those marked "compiled" only), then ``random_examples`` Hypothesis draws, all inside the
    implementation's declaration; a failure is shrunk for properties.SHRINK_BUDGET_S at most. ``requires(impl)``:
    why the property does not apply (decided at collection), beside ``applicability``."""
    if test is None:
        return functools.partial(sequence_parallel_property, corners=corners, requires=requires)

    @functools.wraps(test)
    def run(*args, **kwargs):
        impl = kwargs["impl"]
        base = test._hypothesis_internal_use_settings
        support.reset_support_counts()
        accepted = impl.accepted_keywords(OP)
        plan = DrawingPlan(declaration_of(impl), impl.compiled, None if accepted is None else frozenset(accepted),
                           impl.region)
        chosen = [corner for corner in corners if corner.get("compiled") or not impl.compiled]
        try:
            with drawing_for(plan):
                judged = run_covering_set(test, chosen, args, kwargs)
                examples = random_examples(impl, base.max_examples)
                if not examples:
                    if not judged:
                        pytest.skip(f"unsupported: no corner lies inside the declaration "
                                    f"({support.LAST_UNSUPPORTED[0] or 'none could be built'})")
                    return None
                test._hypothesis_internal_use_settings = settings(base, max_examples=examples)
                with bounded_failure(test):
                    return test(*args, **kwargs)
        except Unsatisfiable:
            pytest.skip(f"unsupported: every generated case was unsupported ({support.LAST_UNSUPPORTED[0]})")
        finally:
            test._hypothesis_internal_use_settings = base

    def reason(impl):
        return applicability(impl) or (requires(impl) if requires else None)

    return pytest.mark.applies_to.with_args(reason)(run)


def needs_gradients(impl) -> str | None:
    """``requires`` of the gradient property: an ARRAY whose adapter differentiates and declared gradients."""
    if not impl.implements(OP) or impl.array not in PROCESS_ARRAYS:
        return None
    if not ARRAY_KINDS[impl.array].DIFFERENTIABLE or not declaration_of(impl).gradients:
        return f"{impl.name} declares no gradients (SEQUENCE_PARALLEL['gradients'] or GRADIENTS)"
    return None


def needs_windows_or_sinks(impl) -> str | None:
    """``requires`` of the window-and-sink property: a signature with a window or a learnable sink."""
    if not impl.implements(OP) or impl.array not in PROCESS_ARRAYS:
        return None
    accepted = impl.accepted_keywords(OP)
    if accepted is not None and not {"window", "learnable_sink"} & accepted:
        return f"unsupported: {impl.name}.{OP} has no 'window' and no 'learnable_sink' parameter"
    return None


def needs_uneven_lengths(impl) -> str | None:
    """``requires`` of the uneven-lengths property: declared uneven_lengths."""
    if not impl.implements(OP) or impl.array not in PROCESS_ARRAYS:
        return None
    if not declaration_of(impl).uneven_lengths:
        return (f"unsupported: {impl.name} declares uneven_lengths False (SEQUENCE_PARALLEL): lengths that N does "
                "not divide are never drawn")
    return None

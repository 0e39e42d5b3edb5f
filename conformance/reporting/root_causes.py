"""One root cause per message: the factors an implementation's failures share, one summary line each.

A user's first question on a red run is "how many things are wrong?", not "which clauses". One defect surfaces
under several clauses (an exception raised whenever mask and is_causal come together is blamed on causal.top-left,
mask.before-softmax, ...), so the summary names the causes before the per-clause list:

* hangs are one cause: the calls that got no result within the call time limit, and the later cases failed at
  once, without a call, while a hung call still ran (their case's factors do not explain them);
* failures that raised the same exception (type and message, numbers aside) are one cause, with the condition of
  their cases that explains them where one does (shared by every one of them, met by no case that passed);
* among the others, greedily, the condition (one factor of the case, or two together) met by the most failures
  and almost never by a case that passed (at least ``SPECIFICITY`` of the cases meeting it failed) is a cause,
  until none explains two failures.

Factors are read off the record: its dtype, and for a generated sdpa case its label (``B1 Hq3/Hkv1 Lq3 Lk7 Dk1
Dv1 mask=float causal scale=-1.0 ...``): mask kind, is_causal, mask with is_causal, the scale's sign, the head dim,
Lq against Lk, the kv heads against the query heads; for a multi-head attention case (``B2 H1 Lq3 Lk3 E5 E_kv5
Dk1 Dv4 bias=all mask=none causal ...``) also its in- and output-projection biases, one head or several, and E_kv
against E. A cause is a summary of the verdicts, never a verdict: every
failure is still reported under its clause.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from itertools import combinations

from attention_conformance.conformance.judging.records import distinct

SPECIFICITY = 0.8  # a condition is a cause if at least this share of the judged cases meeting it failed


MESSAGE_WIDTH = 90  # characters of an exception message in a cause line


_RAISED = re.compile(r"raised (?P<type>[A-Za-z_][\w.]*): (?P<message>.*?)(?: \(at [^)]*\))?(?:;|$)")


_LABEL = re.compile(r"\bLq(?P<lq>\d+) Lk(?P<lk>\d+) Dk(?P<dk>\d+) Dv(?P<dv>\d+) mask=(?P<mask>\S+)(?P<causal> causal)? "
                    r"scale=(?P<scale>\S+)")


_HEADS = re.compile(r"\bHq(?P<hq>\d+)/Hkv(?P<hkv>\d+)\b")


_MHA_LABEL = re.compile(r"\bH(?P<h>\d+) Lq(?P<lq>\d+) Lk(?P<lk>\d+) E(?P<e>\d+) E_kv(?P<ekv>\d+) Dk(?P<dk>\d+) Dv\d+ "
                        r"bias=(?P<bias>\S+) mask=(?P<mask>\S+)(?P<causal> causal)?")


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


WORDS = {  # factor -> how a cause line says it
    ("mask+causal", "yes"): "mask and is_causal are both given",
    ("is_causal", "yes"): "is_causal", ("is_causal", "no"): "not is_causal",
    ("scale", "negative"): "scale < 0", ("scale", "zero"): "scale = 0", ("scale", "positive"): "scale > 0",
    ("scale", "default"): "the default scale",
    ("mask", "float"): "a float mask", ("mask", "bool"): "a boolean mask", ("mask", "none"): "no mask",
    ("lengths", "Lq>Lk"): "Lq > Lk", ("lengths", "Lq<Lk"): "Lq < Lk", ("lengths", "Lq=Lk"): "Lq = Lk",
    ("kv", "grouped"): "1 < Hkv < Hq (grouped kv heads)", ("kv", "one"): "one kv head for several query heads",
    ("kv", "full"): "Hkv = Hq",
    ("in_bias", "yes"): "in-projection biases", ("in_bias", "no"): "no in-projection bias",
    ("out_bias", "yes"): "an output-projection bias", ("out_bias", "no"): "no output-projection bias",
    ("heads", "several"): "several heads", ("heads", "one"): "one head",
    ("kv_width", "other"): "E_kv != E", ("kv_width", "same"): "E_kv = E",
    ("value_dim", "other"): "Dv != Dk", ("value_dim", "same"): "Dv = Dk",
}


# An exception raised whenever one factor holds is often a refusal the implementation documents (Keras's NumPy
# backend and grouped kv heads): the declaration that makes such cases unsupported, so the rest is judged (a property
# stops at its first failure, and each property's first corner has grouped kv heads).
DECLARATIONS = {
    ("kv", "grouped"): '"gqa": False', ("kv", "one"): '"gqa": False',
    ("scale", "negative"): '"scale": "nonnegative"', ("scale", "zero"): '"scale": "positive"',
    ("mask", "float"): '"masks": ["none", "bool"]', ("mask", "bool"): '"masks": ["none", "float"]',
    ("is_causal", "yes"): '"causal": False',
}


@dataclass(frozen=True)
class Cause:
    implementation: str
    description: str  # what the failures share, in words
    failures: int
    clauses: tuple[str, ...]  # the clauses it explains, in order of first appearance
    declare: str = ""  # for an exception raised whenever one factor holds: the SUPPORTS entry that would refuse it

    def line(self) -> str:
        hint = (f"; if {self.implementation} does not take such cases, SUPPORTS {{{self.declare}}} makes them "
                "unsupported and judges the rest") if self.declare else ""
        return (f"{self.implementation} cause: {self.description} ({self.failures} failure"
                f"{'s' if self.failures != 1 else ''}; explains {', '.join(self.clauses)}{hint})")

    def as_dict(self) -> dict:
        return {"implementation": self.implementation, "cause": self.description, "failures": self.failures,
                "clauses": list(self.clauses), **({"declare": self.declare} if self.declare else {})}


def _shape_factors(causal: bool, mask: str, lq: int, lk: int, dk: str) -> set:
    """The factors an sdpa and a multi-head attention case share: is_causal, mask kind, both together, Dk, Lq : Lk."""
    found = {("is_causal", "yes" if causal else "no"), ("mask", mask), ("Dk", dk),
             ("lengths", "Lq>Lk" if lq > lk else "Lq<Lk" if lq < lk else "Lq=Lk")}
    if mask != "none" and causal:
        found.add(("mask+causal", "yes"))
    return found


def factors(rec) -> frozenset:
    """(name, value) pairs of the case a record judged."""
    found = {("dtype", rec.dtype)}
    mha = _MHA_LABEL.search(rec.case or "")
    if mha:  # a multi-head attention case (strategies.mha_cases): its projections' biases, heads and widths
        # An independently written MHA that added the in-projection bias to q only failed 31 cases under 9 clauses, no
        # cause.
        found |= _shape_factors(bool(mha["causal"]), mha["mask"].split("-")[0], int(mha["lq"]), int(mha["lk"]),
                                mha["dk"])
        found |= {("in_bias", "yes" if mha["bias"] in ("input", "all") else "no"),
                  ("out_bias", "yes" if mha["bias"] in ("output", "all") else "no"),
                  ("heads", "one" if mha["h"] == "1" else "several"),
                  ("kv_width", "same" if mha["e"] == mha["ekv"] else "other")}
        return frozenset(found)
    label = _LABEL.search(rec.case or "")
    if label:
        causal = bool(label["causal"]) and "[no causal]" not in rec.case  # a derived case without is_causal
        mask = label["mask"].split("-")[0]
        if "on every score]" in rec.case:  # test_shift_invariance's derived case adds a constant float mask
            mask = "float"
        found |= _shape_factors(causal, mask, int(label["lq"]), int(label["lk"]), label["dk"])
        # Dv against Dk: torch 2.13's CPU sdpa refuses a mask with is_causal only where Dv != Dk (its math path), a
        # cause of three features that read "whenever is_causal and a float mask" until a run drew a boolean one.
        found.add(("value_dim", "same" if label["dv"] == label["dk"] else "other"))
        heads = _HEADS.search(rec.case or "")
        if heads:  # Keras 3.15's NumPy backend raised for every grouped case and none of the others
            hq, hkv = int(heads["hq"]), int(heads["hkv"])
            found.add(("kv", "full" if hkv == hq else "one" if hkv == 1 else "grouped"))
        scale = label["scale"]
        if scale == "None":
            found.add(("scale", "default"))
        else:
            try:
                value = float(scale)
            except ValueError:
                value = None
            if value is not None:
                found.add(("scale", "negative" if value < 0 else "zero" if value == 0 else "positive"))
    return frozenset(found)


def raised(rec) -> str | None:
    """'Type: message' of the exception a failure reports (numbers as <n>), or None."""
    lines = (rec.message or "").splitlines()
    problem = next((line for line in lines if line.strip().startswith("problem")), "")
    found = _RAISED.search(problem)
    if not found:
        return None
    message = _NUMBER.sub("<n>", found["message"].strip())
    if len(message) > MESSAGE_WIDTH:
        message = message[: MESSAGE_WIDTH - 3].rstrip() + "..."
    return f"{found['type']} \"{message}\""


def hang(rec) -> str | None:
    """"hung" for a call that got no result within the call time limit (containment.call_with_limit), "not called"
    for a case failed at once because an earlier call still ran, else None."""
    message = rec.message or ""
    if "the call hung: no result within" in message:
        return "hung"
    if " hung earlier on case " in message:
        return "not called"
    return None


_HUNG_EARLIER = re.compile(r" hung earlier on case (.+?) \(no result within")


def _hang_cause(name: str, failures: list) -> Cause:
    hung = [rec for rec in failures if hang(rec) == "hung"]
    waited = len(failures) - len(hung)
    # A call the per-test time limit interrupted (before the call limit) fails its test with the Timeout, not with a
    # record: its case is known from the later cases that name it (torch_flex on an H200: "hung on 0 cases" before).
    count = len(hung) or len({found.group(1) for rec in failures
                              if (found := _HUNG_EARLIER.search(rec.message or ""))})
    limit = "the call time limit" if hung else "the per-test time limit"
    text = f"the call hung (no result within {limit}) on {count} case{'s' if count != 1 else ''}"
    if waited:
        text += f"; {waited} later case{'s were' if waited != 1 else ' was'} failed without a call while it ran"
    return Cause(name, text, len(failures), _clauses(failures))


def _words(condition) -> str:
    parts = []
    for name, value in sorted(condition):
        parts.append(WORDS.get((name, value)) or f"{name} {value}")
    return " and ".join(parts)


def _clauses(failures) -> tuple[str, ...]:
    return tuple(dict.fromkeys(rec.clause for rec in failures))


def _conditions(failures) -> set:
    """Single factors and pairs of factors met by at least one of ``failures``."""
    found = set()
    for rec in failures:
        fs = sorted(factors(rec))
        found.update(frozenset([f]) for f in fs)
        found.update(frozenset(pair) for pair in combinations(fs, 2))
    return found


def _meets(rec, condition) -> bool:
    return condition <= factors(rec)


def implementation_causes(name: str, failures: list, passes: list) -> list[Cause]:
    hangs, by_exception = [], defaultdict(list)
    for rec in failures:
        if hang(rec):
            hangs.append(rec)
        else:
            by_exception[raised(rec)].append(rec)
    causes = [_hang_cause(name, hangs)] if hangs else []
    remaining = by_exception.pop(None, [])
    for exception, group in sorted(by_exception.items(), key=lambda item: -len(item[1])):
        # The condition met by the most of them and by no case that passed (the fewest factors on a tie).
        ranked = sorted(((sum(_meets(rec, c) for rec in group), c) for c in _conditions(group)
                         if not any(_meets(rec, c) for rec in passes)),
                        key=lambda item: (-item[0], len(item[1]), sorted(item[1])))
        text, declare = f"raises {exception}", ""
        if ranked and 2 * ranked[0][0] >= len(group):
            condition = ranked[0][1]
            text += (" whenever " + _words(condition) if ranked[0][0] == len(group) else
                     f" when {_words(condition)} ({ranked[0][0]} of {len(group)})")
            declare = DECLARATIONS.get(next(iter(condition)), "") if len(condition) == 1 else ""
        causes.append(Cause(name, text, len(group), _clauses(group), declare))
    while len(remaining) >= 2:
        best = None
        for condition in _conditions(remaining):
            covered = [rec for rec in remaining if _meets(rec, condition)]
            passed = sum(_meets(rec, condition) for rec in passes)
            if len(covered) < 2 or len(covered) / (len(covered) + passed) < SPECIFICITY:
                continue
            key = (len(covered), -passed, -len(condition))
            if best is None or key > best[0]:
                best = (key, condition, covered)
        if best is None:
            break
        _, condition, covered = best
        causes.append(Cause(name, _words(condition), len(covered), _clauses(covered)))
        remaining = [rec for rec in remaining if not _meets(rec, condition)]
    return causes


def root_causes(records) -> list[Cause]:
    """The causes of every implementation's failures (distinct cases), implementations in name order."""
    failures, passes = defaultdict(list), defaultdict(list)
    for rec in distinct(records):
        if rec.status == "failed":
            failures[rec.implementation].append(rec)
        elif rec.status == "passed":
            passes[rec.implementation].append(rec)
    causes = []
    for name in sorted(failures):
        causes.extend(implementation_causes(name, failures[name], passes[name]))
    return causes

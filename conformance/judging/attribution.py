"""Attribution: which clause a fault breaks, found by re-running the case without a feature.

A case drawn for one clause carries other features (is_causal, a mask, the default scale, grouped kv
heads, variant keywords). When its values are off, each feature the test is not about is taken out in
turn, the math of the rest kept; if the case then passes, the fault is that feature's, and the failure
is filed under its clause, not the test's. So a causal off-by-one met by a test of large inputs is
reported as causal.top-left, where its repro is read. When the case also passes without the feature it
was drawn for (its own probe), the fault stays with the test's clause.

``Attribution`` is the part of the Judge (verdict.py) that makes these probes. A probe records nothing
and never skips: it only answers "does the implementation pass this case?".
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.judging.containment import input_copies, call_with_limit, flat, is_array
from attention_conformance.conformance.judging.expected import allowed_error, expected_output
from attention_conformance.conformance.reference import oracle
from attention_conformance.conformance.reference.output_forms import SEQUENCE_OPS, canonical_output
from attention_conformance.implementations.arrays import dtype_name
from attention_conformance.implementations.contract import (
    LAYOUT_SHAPES,
    LAYOUTS,
    SEQUENCE_ALIGNMENTS,
    VARIANT_DEFAULTS,
)

LAYOUT_CLAUSE = "contract.layout"  # q, k, v and the output in the declared LAYOUT


ALIGNMENT_CLAUSES = {"sdpa_varlen": "varlen.alignment", "sdpa_paged": "paged.alignment"}  # SEQUENCE_ALIGNMENT


SEQUENCE_DEFINITIONS = {"sdpa_varlen": "varlen.definition", "sdpa_paged": "paged.definition"}


SEQUSED_CLAUSE = "varlen.seqused-k"  # sdpa_varlen's seqused_k: only the first seqused_k[b] keys of sequence b


# The variant keywords each variant clause is about: its own probe takes them out (a case that then
# passes keeps the failure with the clause, whatever else the case carries).
ORDER_CLAUSE = "sdpa.variant-order"  # the order in which the variant keywords act together


VARIANT_CLAUSE_KEYWORDS = {
    "sdpa.window": ("window",), "sdpa.softcap": ("softcap",), "sdpa.alibi": ("alibi_slopes",),
    "sdpa.query-offset": ("query_offset",), "sdpa.varlen": ("key_lengths", "query_lengths"),
    "sdpa.variant-order": ("softcap", "alibi_slopes", "window", "key_lengths", "query_offset"),
    "sdpa.learnable-sink": ("learnable_sink",), "sdpa.sink-tokens": ("sink_token_length",),
    "sdpa.attention-chunk": ("attention_chunk",), "sdpa.key-leftpad": ("key_leftpad",),
}


# multi_head_attention's variant cases (mha.variants) carry several keywords; each is taken out in turn, the one
# whose keys or bias others build on last (sink tokens act only beside the window's left edge, ALiBi moves with the
# offset, so a fault of theirs passes without the window or the offset too), then softcap and the learnable sink,
# which change every score or weight of a row: a case can pass without them while another keyword is at fault (in
# 20 fresh runs each, a scaled ALiBi was once filed under sdpa.softcap and a dropped window under
# sdpa.learnable-sink when they came earlier).
MHA_VARIANT_PROBES = ("sink_token_length", "attention_chunk", "key_leftpad", "alibi_slopes", "window", "key_lengths",
                      "query_offset", "softcap", "learnable_sink")


# FP8 attention: an 8-bit case drawn for the descale clause is probed with one factor per tensor.
FP8_DESCALE_CLAUSE = "sdpa.fp8-descale"


def _descales_repeated(inputs: dict, group: int) -> dict:
    """An 8-bit case's descale factors (B, Hkv) for its kv heads repeated G times: each kv head's factor repeated,
    so that query head h still meets the factors of kv head h // G (q_descale too: (B, Hq) is then (B, Hkv))."""
    return {name: np.repeat(factors, group, axis=1) for name, factors in oracle.descale_options(inputs).items()}


def _scores_matter(case: Case) -> bool:
    """Whether some row of the case weighs two or more terms (attended keys, and the learnable sink). A row of one
    term puts weight 1 on it whatever the scores, so a probe that leaves every row so (one key, its sink taken out)
    passes any fault of the scores, the scale or a float mask's values, and acquits nothing (an independently written
    MHA that
    added its float mask before the scale was filed under sdpa.learnable-sink on such a case)."""
    inputs = case.inputs
    if case.op == "sdpa":
        lq, lk = inputs["q"].shape[-2], inputs["k"].shape[-2]
    elif case.op == "multi_head_attention":
        lq, lk = inputs["query"].shape[1], inputs["key"].shape[1]
    else:
        return True
    bias = oracle.attention_bias(inputs.get("mask"), inputs.get("is_causal", False), lq, lk,
                                 **oracle.key_options(oracle.variant_options(inputs)))
    terms = np.sum(np.isfinite(bias), axis=-1) + (inputs.get("learnable_sink") is not None)
    return bool(np.any(terms >= 2))


def _size(inputs: dict) -> int:
    return sum(int(np.size(array)) for _, array in flat(inputs) if isinstance(array, np.ndarray))


class Attribution:
    """Probes that re-run a failing case with one feature changed, to blame the clause at fault.

    A mixin of the Judge (judging.py), which supplies ``impl``, ``dtype``, ``device``, ``call_limit``,
    ``policy``, ``allowed`` and ``_unjudged``.
    """

    # Cases larger than this are not re-run: each probe costs a call and an oracle evaluation.
    DIAGNOSIS_MAX_ELEMENTS = 1 << 20

    def _variants(self, case: Case):
        """(clause at fault, how the case was changed, changed case), most telling first.

        First the changes that keep the math (the default scale passed explicitly, grouped kv
        heads repeated, the mask broadcast beforehand): a case that then passes convicts the
        implicit path, whatever else the case was drawn for (not the test's own clause, which
        keeps the failure anyway). Then features taken out (is_causal, the mask, Dv != Dk), each
        only if the case was not drawn for it.
        """
        about, own = set(case.clauses), case.clauses[0]
        inputs = case.inputs

        def derived(words, **changes):
            return Case(case.op, {**inputs, **changes}, case.clauses, f"{case.label} [{words}]", case.mask_kind,
                        case.notes)

        mask = inputs.get("mask")
        if case.op == "sdpa":
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
            if inputs.get("scale") is None and own != "sdpa.scale-default":
                yield ("sdpa.scale-default", "with scale=1/sqrt(Dk) passed explicitly",
                       derived("explicit default scale", scale=float(q.shape[-1]) ** -0.5))
            if q.shape[1] != k.shape[1] and own != "sdpa.gqa-mapping":
                group = q.shape[1] // k.shape[1]
                yield ("sdpa.gqa-mapping", "with the kv heads repeated to Hq beforehand",
                       derived("kv heads repeated", k=np.repeat(k, group, axis=1), v=np.repeat(v, group, axis=1),
                               **_descales_repeated(inputs, group)))
            target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            if mask is not None and mask.shape != target and own != "mask.broadcast":
                yield ("mask.broadcast", "with the mask broadcast to (B, Hq, Lq, Lk) beforehand",
                       derived("mask broadcast", mask=np.broadcast_to(mask, target).copy()))
        # Variant keywords the case was not drawn for, each taken out in turn: an MHA variant case carries several,
        # as does an sdpa case combining variants (test_learnable_sink_joins_after_the_other_variants: a key_lengths
        # that kept key j == length was filed under sdpa.learnable-sink, its case passing without key_lengths).
        if case.op in ("multi_head_attention", "sdpa"):
            for name in (n for n in MHA_VARIANT_PROBES if n in oracle.variant_options(inputs)):
                clause = next(c for c, names in VARIANT_CLAUSE_KEYWORDS.items() if names == (name,)) \
                    if name != "key_lengths" else "sdpa.varlen"
                if clause not in about:
                    dropped = ("key_lengths", "query_lengths") if name == "key_lengths" else (name,)
                    yield clause, f"without {name}", derived(f"without {name}",
                                                             **{n: VARIANT_DEFAULTS[n] for n in dropped})
        if case.op == "multi_head_attention" and inputs["params"].get("b_o") is not None \
                and own != "mha.output-projection":
            # An output bias added wrongly (once per head, say) fails every MHA test a case with b_o meets.
            yield ("mha.output-projection", "without the output bias b_o",
                   derived("without b_o", params={n: p for n, p in inputs["params"].items() if n != "b_o"}))
        # With a query_offset the causal band is that clause's (sdpa.query-offset), not the top-left one's.
        causal_clause = "sdpa.query-offset" if inputs.get("query_offset") else "causal.top-left"
        if inputs.get("is_causal") and not any(c.startswith("causal.") for c in about) and causal_clause not in about:
            yield causal_clause, "without is_causal", derived("without is_causal", is_causal=False)
        if mask is not None and not any(c.startswith("mask.") or c.startswith("causal.") for c in about):
            own_mask = "mask.bool-true-attends" if mask.dtype == np.bool_ else "mask.float-additive"
            yield own_mask, "without the mask", derived("without the mask", mask=None)
        if case.op == "sdpa":
            q, v = inputs["q"], inputs["v"]
            if v.shape[-1] != q.shape[-1] and not about & {"sdpa.value-dim", "sdpa.output-shape"}:
                dk = q.shape[-1]
                same = np.concatenate([v] * -(-dk // v.shape[-1]), axis=-1)[..., :dk]
                yield "sdpa.value-dim", "with Dv = Dk", derived("Dv = Dk", v=same)

    def _passes(self, case: Case, impl=None, alignment: str | None = None) -> bool:
        """Whether the implementation (or ``impl``, the same with another LAYOUT) passes ``case`` (values within the
        tolerance); False when it cannot tell. ``alignment``: judged against the oracle of that SEQUENCE_ALIGNMENT
        instead of the declared one (sdpa_varlen, sdpa_paged; fully masked rows then under the implementation's one
        policy, or zeros).

        Records nothing and never skips: a probe for the attribution only.
        """
        impl = self.impl if impl is None else impl
        inputs = case.rounded(self.dtype)
        if impl.unsupported_reason(case.op, inputs, self.dtype, self.device):
            return False
        try:
            got = canonical_output(case.op, call_with_limit(impl, case.label, impl.call, case.op,
                                                            input_copies(case.arrays(inputs)), case.options(), self.device,
                                                            limit=self.call_limit()))
            policy = self.policy(case, inputs) if alignment is None else (self.impl.uniform_policy or "zeros")
            alignment = alignment or self.alignment
            want = expected_output(case, inputs, policy, alignment)
            if not is_array(got) or got.shape != want.shape or dtype_name(got.dtype) != impl.output_dtype(self.dtype):
                return False
            allowed = np.broadcast_to(allowed_error(case, inputs, self.dtype, policy, tf32=self.tf32,
                                                    alignment=alignment), want.shape)
        except Exception:  # noqa: BLE001 -- raised or hung: no evidence either way
            return False
        got = np.asarray(got, dtype=np.float64)
        want_nan = self._unjudged(case, inputs, want)  # the "nan" policy's rows and padding rows: anything goes
        with np.errstate(invalid="ignore"):
            ok = want_nan | (np.isfinite(got) & (np.abs(got - np.where(want_nan, 0.0, want)) <= allowed))
        return bool(np.all(ok))

    def surfaced_fault(self, case: Case, inputs: dict) -> tuple[str, str] | None:
        """(clause, how) when the case passes with one feature the test is not about taken out."""
        if case.op == "softmax" or _size(inputs) > self.DIAGNOSIS_MAX_ELEMENTS or getattr(self.impl, "hung_on", None):
            return None
        if case.op in SEQUENCE_OPS:
            layout = self._layout_fault(case) if case.op == "sdpa_paged" else None
            return layout or self._alignment_fault(case) or self._seqused_fault(case) or self._not_the_alignment(case)
        layout = self._layout_fault(case)
        if layout:
            return layout  # every clause the case was drawn for fails in the wrong layout
        if case.clauses[0] == ORDER_CLAUSE:
            # The order's own probe takes every variant keyword out, which mends any one keyword's fault as well: a
            # fault that one feature's removal alone mends is that feature's; one that several mend is the order's.
            mending = list(itertools.islice(((clause, how) for clause, how, variant in self._variants(case)
                                             if _scores_matter(variant) and self._passes(variant)), 2))
            return mending[0] if len(mending) == 1 else None
        own = self._own_probe(case)
        if own is not None and self._passes(own):
            return None  # the feature the case was drawn for is at fault: the failure stays with it
        for clause, how, variant in self._variants(case):
            if _scores_matter(variant) and self._passes(variant):
                return clause, how + self._pair_words(case, clause)
        return None

    def _keyword_probes(self, case: Case):
        """(clause, how, case) of _variants that take out one variant keyword."""
        return ((clause, how, variant) for clause, how, variant in self._variants(case)
                if how.startswith("without ") and how[len("without "):] in VARIANT_DEFAULTS)

    def _pair_words(self, case: Case, clause: str) -> str:
        """When the case also passes without another variant keyword than ``clause``'s: the words naming the pair
        (a fault only the two features produce together, sdpa.feature-pairs), else ""."""
        if clause not in VARIANT_CLAUSE_KEYWORDS:
            return ""
        for other, how, variant in self._keyword_probes(case):
            if other != clause and _scores_matter(variant) and self._passes(variant):
                return f", and {how} too: the fault is where the two meet ({clause} with {other})"
        return ""

    def pair_partner(self, case: Case) -> str:
        """For a failure that stays with the clause the case was drawn for (its own probe passes): the words naming
        a second feature whose removal alone makes the case pass too (the pair's fault), else ""."""
        own = case.clauses[0]
        if case.op not in ("sdpa", "multi_head_attention") or own not in VARIANT_CLAUSE_KEYWORDS \
                or _size(case.inputs) > self.DIAGNOSIS_MAX_ELEMENTS or getattr(self.impl, "hung_on", None):
            return ""
        probe = self._own_probe(case)
        if probe is None or not self._passes(probe):
            return ""
        for other, how, variant in self._keyword_probes(case):
            if other != own and _scores_matter(variant) and self._passes(variant):
                return (f"; the case passes without the feature of {own} and {how} too: the fault is where the two "
                        f"meet ({own} with {other})")
        return ""

    def _layout_fault(self, case: Case) -> tuple[str, str] | None:
        """sdpa (and sdpa_paged, whose q and output follow LAYOUT): (contract.layout, how) when the case passes with
        q, k, v handed in the other LAYOUT, the implementation computing in one axis order while it declares the
        other."""
        if case.op == "sdpa_paged":
            if min(case.inputs["q"].shape[1:3]) < 2:
                return None  # one head or one query: q reads the same in either layout
        elif case.op != "sdpa" or case.inputs["k"].shape[2] < 2:
            return None  # one key: every weight is 1 in either layout, the probe could not tell them apart
        elif not _scores_matter(case):
            # No row weighs two keys: the output copies rows of v (or is 0), which the other layout's reading may copy
            # alike whatever the fault (a tiled kernel's key-length bug that attended keys of key_lengths [0] in its
            # first blocks, and a window keeping each query's own key alone in a fixture of one head, were filed
            # under contract.layout).
            return None
        declared = self.impl.layout
        other = next(layout for layout in LAYOUTS if layout != declared)
        if not self._passes(case, dataclasses.replace(self.impl, layout=other)):
            return None
        return (LAYOUT_CLAUSE, f"with q, k, v handed as {LAYOUT_SHAPES[other]} (LAYOUT {other!r}) instead of the "
                               f"declared {LAYOUT_SHAPES[declared]} (LAYOUT {declared!r})")

    def _alignment_fault(self, case: Case, drawn_for_it: bool = False) -> tuple[str, str] | None:
        """sdpa_varlen, sdpa_paged: (its alignment clause, how) when the failing case passes against the oracle of the
        other SEQUENCE_ALIGNMENT: each sequence's queries placed top-left where bottom-right is declared (or the other
        way round). Whatever the case was drawn for (a misplaced band is the alignment's fault, also in a fixture
        about a page boundary), where the alignment moves something (is_causal, a window or ALiBi); not asked, unless
        ``drawn_for_it`` (a fully masked row's verdict), of a case whose first clause is the alignment's: the failure
        is filed there already."""
        clause = ALIGNMENT_CLAUSES[case.op]
        inputs = case.inputs
        if (case.clauses[0] == clause and not drawn_for_it) or not (
                inputs.get("is_causal") or inputs.get("window") is not None or inputs.get("alibi_slopes") is not None):
            return None
        other = next(a for a in SEQUENCE_ALIGNMENTS if a != self.alignment)
        if not self._passes(case, alignment=other):
            return None
        return clause, (f"against each sequence's queries aligned {other} instead of the declared {self.alignment} "
                        "(SEQUENCE_ALIGNMENT)")

    def _seqused_fault(self, case: Case, drawn_for_it: bool = False) -> tuple[str, str] | None:
        """sdpa_varlen: (varlen.seqused-k, how) when the failing case passes packed without seqused_k, each sequence's
        unused key rows taken out of k and v (the same math: Lk_b = seqused_k[b] either way). A kernel that reads
        seqused_k wrongly (a 0 read as "not given", say) passes it; one whose fault lies elsewhere (the empty rows'
        policy, a window) fails it alike. Not asked, unless ``drawn_for_it`` (a fully masked row's verdict), of a case
        drawn for varlen.seqused-k: the failure is filed there."""
        inputs = case.inputs
        used = inputs.get("seqused_k")
        if case.op != "sdpa_varlen" or used is None or (case.clauses[0] == SEQUSED_CLAUSE and not drawn_for_it):
            return None
        used = np.asarray(used, dtype=np.int64)
        if np.array_equal(np.diff(inputs["cu_seqlens_k"]), used):
            return None  # every packed key is used: the probe would be the case itself
        spans = oracle.varlen_spans(inputs["cu_seqlens_q"], inputs["cu_seqlens_k"], used)
        rows = np.concatenate([np.arange(start, end) for _, _, start, end in spans]).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(used)]).astype(np.asarray(inputs["cu_seqlens_k"]).dtype)
        packed = {**{name: value for name, value in inputs.items() if name != "seqused_k"},
                  "k": inputs["k"][rows], "v": inputs["v"][rows], "cu_seqlens_k": offsets,
                  "max_seqlen_k": int(used.max(initial=0))}
        probe = Case(case.op, packed, case.clauses, f"{case.label} [unused keys unpacked]", case.mask_kind, case.notes)
        if not self._passes(probe):
            return None
        return SEQUSED_CLAUSE, ("packed without seqused_k (each sequence's unused key rows taken out of k and v, "
                                "cu_seqlens_k rebuilt): the same math, so how seqused_k is read is at fault")

    def _not_the_alignment(self, case: Case) -> tuple[str, str] | None:
        """A case drawn for the alignment clause that fails against both alignments: the fault is elsewhere (a page
        read from the wrong block, keys past seqused_k), filed under the operation's definition."""
        if case.clauses[0] != ALIGNMENT_CLAUSES[case.op]:
            return None
        other = next(a for a in SEQUENCE_ALIGNMENTS if a != self.alignment)
        if self._passes(case, alignment=other):
            return None  # the alignment is at fault: the failure stays with its clause
        return (SEQUENCE_DEFINITIONS[case.op], f"against neither alignment (declared {self.alignment}, other "
                                               f"{other}), so where the queries sit is not at fault")

    @staticmethod
    def _own_probe(case: Case) -> Case | None:
        """The case without the feature of the clause it was drawn for (None: no such feature)."""
        own, inputs = case.clauses[0], case.inputs
        mask = inputs.get("mask")
        changes = None
        if own.startswith("causal.") and inputs.get("is_causal"):
            changes = {"is_causal": False}
        elif own.startswith("mask.") and mask is not None:
            changes = {"mask": None}
        elif case.op == "sdpa":
            q, k, v = inputs["q"], inputs["k"], inputs["v"]
            if own == "sdpa.scale-default" and inputs.get("scale") is None:
                changes = {"scale": float(q.shape[-1]) ** -0.5}
            elif own == "sdpa.gqa-mapping" and q.shape[1] != k.shape[1]:
                group = q.shape[1] // k.shape[1]
                changes = {"k": np.repeat(k, group, axis=1), "v": np.repeat(v, group, axis=1),
                           **_descales_repeated(inputs, group)}
            elif own == "sdpa.value-dim" and v.shape[-1] != q.shape[-1]:
                dk = q.shape[-1]
                changes = {"v": np.concatenate([v] * -(-dk // v.shape[-1]), axis=-1)[..., :dk]}
        if changes is None and own == FP8_DESCALE_CLAUSE and oracle.descale_options(inputs):
            # One factor per tensor (its first), not 1: stored values near the format's top with a factor of 1 make
            # scores a float32 kernel cannot exponentiate (e5m2's 57344^2), a fault of no clause here.
            changes = {name: np.full_like(factors, factors.flat[0])
                       for name, factors in oracle.descale_options(inputs).items()}
        if changes is None and own in VARIANT_CLAUSE_KEYWORDS:
            names = [n for n in VARIANT_CLAUSE_KEYWORDS[own] if n in inputs]
            if names:
                changes = {n: VARIANT_DEFAULTS[n] for n in names}
        if changes is None:
            return None
        return Case(case.op, {**inputs, **changes}, case.clauses, f"{case.label} [own probe]", case.mask_kind,
                    case.notes)

    def fault_behind(self, clause: str, case: Case, inputs: dict) -> tuple[str, str] | None:
        """For a property's own check of ``clause`` that failed (a metamorphic relation, say): (clause at fault,
        how) when the case's values are off and pass with a feature the test is not about taken out."""
        if case.op == "softmax" or self._passes(case):
            return None  # the values are right: the relation the property checks is what broke
        surfaced = self.surfaced_fault(case, inputs)
        return surfaced if surfaced and surfaced[0] != clause else None

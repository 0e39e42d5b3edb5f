"""Pairwise covering of an operation's features: every two features a case can combine meet in at least one
deterministic corner, inside the judged implementation's declared region.

A feature is a variant keyword the implementation runs (window, softcap, ALiBi, the query offset, key and query
lengths, the learnable sink, sink tokens, chunks, left padding), a mask kind, the causal flag, grouped kv heads and
a length past a key tile. Bugs that live where two features meet (left padding read against key lengths, ALiBi
measured from a padded position, a chunk index inside the padding) are missed by properties about one feature and
left to chance by random draws. ``covering_rows`` builds a covering array of strength 2 over the features by a
greedy construction (each row the set of features one corner turns on, chosen to meet the most pairs not met yet),
with three rules:

- a pair of features other than the causal flag meets in a row without is_causal: the causal band removes the keys
  after each query, where many interactions live (left padding against key lengths, a window's right edge);
- a row turns on at most MAX_KEYWORDS_PER_ROW variant keywords (and one mask kind): the more keywords, the more
  rows lose the keys a pair's interaction needs (a chunk of 1 hides the window);
- a keyword the strategies draw only with another (sink tokens with a window's left edge, query lengths with key
  lengths) brings it along.

``pairwise_hints`` makes each row a corner of the covering set (conformance/harness/properties.py), read by
``feature_pair_cases``; ``pairs_met`` is the self-check's measure (tests/test_pairwise.py).
"""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import hint, hints_for
from attention_conformance.conformance.cases.drawing import keep_inside, runs_variant, signature_takes
from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.cases.softmax import softmax_axis_pairs
from attention_conformance.conformance.cases.variants import (
    SINK_FEATURES,
    VARIANTS,
    draw_sink_chunk_leftpad,
    draw_variant_keywords,
    sink_logits,
)
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.region import Region, shape_facts

# sdpa's variant keywords as features ("key_lengths" and "query_lengths" apart: a kernel may run one alone).
SDPA_KEYWORDS = ("window", "softcap", "alibi_slopes", "query_offset", "key_lengths", "query_lengths",
                 "learnable_sink", "sink_token_length", "attention_chunk", "key_leftpad")
# The keyword features of the other operations, as their strategies name them ("lengths": key and query lengths;
# "seqused_k": a packed batch's used keys). Gradients are sdpa's backward through its variant keywords.
OP_KEYWORDS = {
    "sdpa": SDPA_KEYWORDS,
    "sdpa_varlen": ("window", "softcap", "alibi_slopes", "learnable_sink", "seqused_k"),
    "sdpa_paged": ("window", "softcap", "alibi_slopes", "learnable_sink"),
    "multi_head_attention": VARIANTS + SINK_FEATURES,
    "gradients": VARIANTS + SINK_FEATURES,
}
ALL_KEYWORDS = frozenset(k for names in OP_KEYWORDS.values() for k in names)
MASK_FEATURES = ("mask:bool", "mask:float", "mask:key-padding")  # one per row at most
CAUSAL = "causal"
STRUCTURE_FEATURES = (CAUSAL, "grouped", "past-tile")
# A keyword the strategies draw only beside another (conformance/cases/variants.py).
BRINGS = {"sink_token_length": "window", "query_lengths": "key_lengths"}
MAX_KEYWORDS_PER_ROW = 3
# The mask kind of sdpa_cases each mask feature draws.
MASK_KINDS = {"mask:bool": "bool-full", "mask:float": "float", "mask:key-padding": "key-padding"}


def _closed(row: set[str]) -> frozenset[str]:
    row = set(row)
    for feature in list(row):
        if feature in BRINGS:
            row.add(BRINGS[feature])
    return frozenset(row)


def _keywords(row) -> int:
    return sum(1 for f in row if f in ALL_KEYWORDS)


def _fits(row: frozenset[str]) -> bool:
    return _keywords(row) <= MAX_KEYWORDS_PER_ROW and sum(1 for f in row if f.startswith("mask:")) <= 1


def required_pairs(features) -> set[frozenset[str]]:
    """Every pair of ``features`` that a row can hold: not two mask kinds, and within a row's keyword budget once
    each brings its companions."""
    return {frozenset(pair) for pair in itertools.combinations(sorted(features), 2) if _fits(_closed(set(pair)))}


def met_by(row: frozenset[str]) -> set[frozenset[str]]:
    """The pairs a row meets: with is_causal, only the causal flag's own pairs (the band may hide the others)."""
    pairs = {frozenset(pair) for pair in itertools.combinations(sorted(row), 2)}
    return {p for p in pairs if CAUSAL in p} if CAUSAL in row else pairs


def covering_rows(features) -> list[frozenset[str]]:
    """A covering array of strength 2 over ``features`` (sets of features a corner turns on), built greedily and
    deterministically: each row starts from the first pair not yet met and adds, one at a time, the feature that meets
    the most further pairs while the row fits."""
    features = sorted(set(features))
    uncovered = required_pairs(features)
    rows: list[frozenset[str]] = []
    while uncovered:
        seed = min(uncovered, key=lambda p: sorted(p))
        row = _closed(set(seed))
        while True:
            best, gain = None, 0
            for feature in features:
                if feature in row:
                    continue
                grown = _closed(row | {feature})
                if not _fits(grown) or (CAUSAL in grown) != (CAUSAL in row):
                    continue  # a row is causal or not from its seed pair on
                more = len(met_by(grown) & uncovered) - len(met_by(row) & uncovered)
                if more > gain:
                    best, gain = grown, more
            if best is None:
                break
            row = best
        met = met_by(row) & uncovered
        if not met:  # cannot happen for a required pair; guards the loop
            raise ValueError(f"the pair {sorted(seed)} cannot be met")
        uncovered -= met
        rows.append(row)
    return rows


def pairs_met(rows) -> set[frozenset[str]]:
    return set().union(*(met_by(row) for row in rows)) if rows else set()


def sdpa_features(region: Region, keywords) -> list[str]:
    """sdpa's features inside ``region`` for a signature taking ``keywords`` (None: any)."""
    return op_features("sdpa", region, keywords)


def op_features(op: str, region: Region, keywords) -> list[str]:
    """``op``'s features inside ``region`` for a signature taking ``keywords`` (None: any): the keywords it runs,
    the mask kinds (sdpa's three; multi_head_attention's key padding and float masks), the causal flag, grouped kv
    heads (not multi_head_attention's, whose heads are its own) and, for sdpa, lengths past a key tile."""
    def runs(name: str) -> bool:
        signature_name = "key_lengths" if name == "lengths" else name
        return (name == "seqused_k" or region.allows_variant(signature_name)) and (
            keywords is None or signature_name in keywords)

    found = [name for name in OP_KEYWORDS[op] if runs(name)]
    masks = {"sdpa": MASK_FEATURES, "multi_head_attention": ("mask:key-padding", "mask:float")}.get(op, ())
    if keywords is None or "mask" in keywords:
        found += [m for m in masks if ("float" if m == "mask:float" else "bool") in region.masks]
    if region.causal and (keywords is None or "is_causal" in keywords):
        found.append(CAUSAL)
    if region.gqa and op != "multi_head_attention":
        found.append("grouped")
    if op == "sdpa":
        found.append("past-tile")
    return found


def pairwise_hints(region: Region, keywords, small: bool, op: str = "sdpa") -> list[dict]:
    """The corners of ``op``'s pairwise covering set inside ``region``: each row of covering_rows made concrete
    (covering.hints_for) with its features, Lq < Lk, Lq = Lk and Lq > Lk in turn; for softmax every axis of every
    rank (softmax_axis_pairs). ``op`` "gradients": sdpa's backward through the variant keywords."""
    if op == "softmax":
        return [{"index": i, "rank": rank, "axis": axis} for i, (rank, axis) in enumerate(softmax_axis_pairs())]
    hints = []
    for index, row in enumerate(covering_rows(op_features(op, region, keywords))):
        mask = next((MASK_KINDS[f] for f in row if f in MASK_KINDS), "none")
        corner = dict(is_causal=CAUSAL in row, lengths=("q<k", "q=k", "q>k")[index % 3],
                      kv="grouped" if "grouped" in row else "full", dk="min", scale=None, mask_kind=mask,
                      kernel="past-tile" in row)
        found = hints_for(corner, index, region, small and "past-tile" not in row)
        found.update(features=row, mask_only=False, pairwise=True)
        hints.append(found)
    return hints


def interior_keywords(inputs: dict, features) -> list[str]:
    """A corner's keywords at values where two features interact, put in ``inputs``; their labels. Not the edges its
    own property draws (a window past every key, lengths 0 or full, a padding of every key: each hides the other
    feature), but values that leave some keys removed and some kept: a window (2, 1), key lengths one or two short of
    Lk, query lengths one short of Lq, an offset at the bottom-right (or 1), a chunk of 2, a left padding of 1 or 2
    that leaves the first queries inside the padding, one sink token, a softcap at half the largest score, geometric
    ALiBi slopes, a sink among the scores."""
    q, k = inputs["q"], inputs["k"]
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    words = []
    if "query_offset" in features:
        inputs["query_offset"] = lk - lq if lk > lq else 1
        words.append(f"offset={inputs['query_offset']}")
    if "window" in features:
        inputs["window"] = (2, 1)
        words.append("window=(2, 1)")
    if "softcap" in features:
        scale = inputs.get("scale", q.shape[-1] ** -0.5)
        top = float(np.max(np.abs(q @ np.swapaxes(oracle.repeat_kv_heads(k, hq), -1, -2) * scale), initial=0.0))
        inputs["softcap"] = float(np.clip(0.5 * max(top, 1e-3), 1e-2, 6e4))
        words.append(f"softcap={inputs['softcap']:.3g}")
    if "alibi_slopes" in features:
        inputs["alibi_slopes"] = 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)
        words.append("alibi=geometric")
    if "key_lengths" in features:
        inputs["key_lengths"] = np.array([max(1, lk - 1 - (e % 2)) for e in range(b)], dtype=np.int32)
        words.append(f"key_lengths={inputs['key_lengths'].tolist()}")
    if "query_lengths" in features:
        inputs["query_lengths"] = np.array([max(1, lq - 1 - (e % 2)) for e in range(b)], dtype=np.int32)
        words.append(f"query_lengths={inputs['query_lengths'].tolist()}")
    if "sink_token_length" in features:
        inputs["sink_token_length"] = 1
        words.append("sink_tokens=1")
    if "attention_chunk" in features:
        inputs["attention_chunk"] = 2
        words.append("chunk=2")
    if "key_leftpad" in features:
        ends = inputs.get("key_lengths", np.full(b, lk))
        inputs["key_leftpad"] = np.array([min(1 + (e % 2), max(int(ends[e]) - 1, 0)) for e in range(b)],
                                         dtype=np.int32)
        words.append(f"key_leftpad={inputs['key_leftpad'].tolist()}")
    if "learnable_sink" in features:
        scores = oracle.scores(q, k, inputs.get("mask"), inputs.get("is_causal", False), inputs.get("scale"),
                               **oracle.variant_options(inputs))
        inputs["learnable_sink"] = sink_logits("among", np.random.default_rng(lq * 31 + lk),
                                               np.broadcast_to(scores, (b, hq, lq, lk)))
        words.append("sink=among")
    return words


@st.composite
def feature_pair_cases(draw, *, clauses=("sdpa.feature-pairs",)) -> Case:
    """An sdpa case turning on the features of a pairwise corner (``hint("features")``); drawn at random, two or
    three keywords the implementation runs, a mask kind, the causal flag. Each keyword at its edges as its own
    property draws it (conformance/cases/variants.py)."""
    features = hint("features")
    if features is None:
        runnable = [k for k in SDPA_KEYWORDS if runs_variant(k)]
        chosen = draw(st.lists(st.sampled_from(runnable), min_size=min(2, len(runnable)),
                               max_size=min(MAX_KEYWORDS_PER_ROW, len(runnable)), unique=True),
                      label="keywords") if runnable else []
        features = _closed(set(chosen))
        kinds = ("none", "bool-full", "float", "key-padding") if signature_takes("mask") else ("none",)
        causal = st.booleans()
    else:
        kinds = (next((MASK_KINDS[f] for f in features if f in MASK_KINDS), "none"),)
        causal = st.just(CAUSAL in features)
    case = draw(sdpa_cases(mask_kinds=kinds, causal=causal, clauses=clauses, allow_empty_rows=True, outermost=False),
                label="base case")
    inputs = dict(case.inputs)
    if hint("features") is not None:
        words = interior_keywords(inputs, features)
    else:
        older = [name for name in VARIANTS if (name == "lengths" and "key_lengths" in features) or name in features]
        words = draw_variant_keywords(draw, inputs, tuple(older))
        if "query_lengths" not in features and "query_lengths" in inputs:
            del inputs["query_lengths"]
            words = [w for w in words if not w.startswith("query_lengths")]
        words += draw_sink_chunk_leftpad(draw, inputs, tuple(f for f in SINK_FEATURES if f in features))
    keep_inside(draw, shape_facts("sdpa", inputs))
    label = f"{case.label} {' '.join(words)} [features: {', '.join(sorted(features))}]"
    return Case("sdpa", inputs, case.clauses, label, mask_kind=case.mask_kind)


def _row_or_drawn(draw, op: str) -> frozenset[str]:
    """The corner's features, else two keywords of ``op`` the implementation runs, drawn."""
    features = hint("features")
    if features is not None:
        return features
    runnable = [k for k in OP_KEYWORDS[op] if k == "seqused_k" or runs_variant(k)]
    chosen = draw(st.lists(st.sampled_from(runnable), min_size=min(2, len(runnable)), max_size=min(2, len(runnable)),
                           unique=True), label="keywords") if runnable else []
    return _closed(set(chosen))


def _causal(features) -> st.SearchStrategy:
    return st.just(CAUSAL in features) if hint("features") is not None else st.booleans()


@st.composite
def sequence_pair_cases(draw, op: str, *, clauses=None) -> Case:
    """A packed (sdpa_varlen) or paged (sdpa_paged) case turning on a pairwise corner's features."""
    from attention_conformance.conformance.cases.sequences import paged_cases, varlen_cases

    features = _row_or_drawn(draw, op)
    variants = tuple(k for k in OP_KEYWORDS[op] if k in features and k != "seqused_k")
    if op == "sdpa_varlen":
        return draw(varlen_cases(clauses=clauses or ("varlen.variants",), variants=variants,
                                 causal=_causal(features), seqused=st.just("seqused_k" in features)), label="case")
    return draw(paged_cases(clauses=clauses or ("paged.variants",), variants=variants, causal=_causal(features)),
                label="case")


@st.composite
def mha_pair_cases(draw, *, clauses=("mha.variants",)) -> Case:
    """A multi_head_attention case turning on a pairwise corner's keywords (each head's attention), mask and causal
    flag."""
    from attention_conformance.conformance.cases.mha import mha_variant_cases

    features = _row_or_drawn(draw, "multi_head_attention")
    names = tuple(k for k in OP_KEYWORDS["multi_head_attention"] if k in features)
    kinds = ((next((MASK_KINDS[f] for f in features if f in MASK_KINDS), "none"),) if hint("features") is not None
             else ("none", "key-padding", "float"))
    if not names:
        names = tuple(k for k in OP_KEYWORDS["multi_head_attention"] if runs_variant(k))[:1]
    return draw(mha_variant_cases(variants=names, required=names, all_of=True, clauses=clauses, mask_kinds=kinds,
                                  causal=_causal(features), min_heads=2), label="case")


@st.composite
def gradient_pair_cases(draw, *, clauses=("grad.variants",)) -> Case:
    """A variant gradient case (an upstream gradient drawn) turning on a pairwise corner's keywords and causal flag."""
    from attention_conformance.conformance.cases.gradients import variant_gradient_cases

    features = _row_or_drawn(draw, "gradients")
    names = tuple(k for k in OP_KEYWORDS["gradients"] if k in features)
    if not names:
        names = tuple(k for k in OP_KEYWORDS["gradients"] if runs_variant(k))[:1]
    return draw(variant_gradient_cases(variants=names, required=names, all_of=True, clauses=clauses,
                                       causal=_causal(features)), label="case")

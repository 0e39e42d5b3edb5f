"""Drawing inside a region: what every strategy of conformance/cases/ shares.

The judged implementation's declared region (SUPPORTS, supports(facts)) is active while a property draws
(``drawing_inside``); a draw it refuses, or whose derived case it refuses, is filtered out before any call. The mask
kinds and their shapes, the causal flag, lengths in order and kernel-shaped lengths are drawn here. Draws are
labelled and sizes capped (conformance/cases/limits.py) so each example stays cheap and a failure shrinks to a small,
readable case; array values come from a drawn seed (NumPy's generator), so shrinking works on shapes, masks and
flags, where attention bugs live, and a repro prints the values literally.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.strategies._internal.strategies import OneOfStrategy

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import (
    COVERING_SCORE_BUDGET,
    CannotBuild,
    DeterministicDraw,
    admits,
    hint,
    strategy_values,
    unwrap,
)
from attention_conformance.conformance.cases.limits import (
    DECODE_CACHE_LENGTHS,
    DECODE_CORNER_PAST,
    KERNEL_EDGE_LENGTHS,
    KERNEL_QUERY_MODES,
    KERNEL_SMALL_LENGTHS,
    MAX_DIM,
    MAX_LEN,
)
from attention_conformance.implementations.region import EVERYTHING, Region, causal_lengths_ok, scale_ok, shape_facts


@dataclass(frozen=True)
class DerivedCase:
    """A second case a property makes from the drawn one (or the drawn case as the test changes it before its
    first call), told by the facts it changes. It must lie inside the region as the drawn case does: a property
    whose derived case no drawn case could keep inside does not apply (conformance/harness/properties.py, decided at
    collection); otherwise a draw whose derived case supports(facts) refuses is filtered out while drawing."""

    what: str  # what the property does to the drawn case, for the skip reason
    sets: dict = field(default_factory=dict)  # facts the derived case has whatever was drawn
    drops: tuple[str, ...] = ()  # variant keywords it takes out

    def facts(self, facts: dict) -> dict:
        derived = {**facts, **self.sets}
        if self.drops:
            derived["variants"] = tuple(v for v in derived.get("variants", ()) if v not in self.drops)
        return derived

    def leaves(self, region: Region, keywords=None) -> str | None:
        """Why no derived case can lie inside ``region`` (its declared keys; supports() is asked per draw) or fit a
        signature that accepts ``keywords`` (None: any): a derived case with a mask needs a ``mask`` parameter."""
        reason = region.why_outside({"op": "sdpa", **self.sets}, ask_supports=False)
        if not reason and keywords is not None and "mask" not in keywords \
                and self.sets.get("mask_kind", "none") != "none":
            reason = "the signature has no 'mask' parameter"
        return f"derived case leaves the region: {self.what}: {reason}" if reason else None


@dataclass(frozen=True)
class _Drawing:
    region: Region
    facts: dict  # what a case's facts hold beside its shapes: dtype, device
    derived: tuple[DerivedCase, ...]
    keywords: frozenset | None  # the sdpa keywords the signature accepts (None: any)
    refused: Counter = field(default_factory=Counter)  # why draws were filtered out, for a property that found none

    def most_refused(self) -> str | None:
        return self.refused.most_common(1)[0][0] if self.refused else None


ACTIVE: list[_Drawing] = [_Drawing(EVERYTHING, {}, (), None)]


@contextlib.contextmanager
def drawing_inside(region: Region, facts: dict | None = None, derived=(), keywords=None):
    """Draw every case inside ``region`` (the judged implementation's SUPPORTS) while active.

    ``facts`` (dtype, device) complete a drawn case's facts for the implementation's supports(facts);
    ``derived``: the property's DerivedCases, each of which must lie inside too; ``keywords``: the sdpa
    keywords the signature accepts (variant keywords it lacks are not drawn where a property leaves them optional).
    Yields the drawing, whose ``most_refused()`` says why draws were filtered out.
    """
    drawing = _Drawing(region, dict(facts or {}), tuple(derived), None if keywords is None else frozenset(keywords))
    ACTIVE.append(drawing)
    try:
        yield drawing
    finally:
        ACTIVE.pop()


def active_region() -> Region:
    return ACTIVE[-1].region


def outside_region(reason: str):
    """The drawn property cannot produce a case inside the region: unsupported, never failed."""
    from attention_conformance.conformance.cases.support import unsupported

    unsupported(f"outside the declared region: {reason}")


def keep_inside(draw, facts: dict) -> None:
    """Filter out a draw whose case, or a derived case of the property, the region refuses (supports(facts)
    above all: the declared keys are met by construction). Inside Hypothesis the draw is rejected (``assume``:
    counted as filtered, never called, never an "unsupported" record); a covering corner is not built."""
    drawing = ACTIVE[-1]
    facts = {**facts, **drawing.facts}
    reason = drawing.region.why_outside(facts)
    for derived in drawing.derived:
        if reason:
            break
        outside = drawing.region.why_outside(derived.facts(facts))
        reason = outside and f"derived case leaves the region: {derived.what}: {outside}"
    if not reason:
        return
    from attention_conformance.conformance.cases.support import LAST_UNSUPPORTED

    drawing.refused[reason] += 1
    LAST_UNSUPPORTED[0] = reason if reason.startswith("derived") else f"outside the declared region: {reason}"
    if isinstance(draw, DeterministicDraw):
        raise CannotBuild(reason)
    assume(False)


def keep_inside_region(draw, case: Case) -> None:
    """``keep_inside`` for a case a strategy outside this module built (dropout's, gradients' own cases)."""
    keep_inside(draw, shape_facts(case.op, case.inputs))


def signature_takes(name: str) -> bool:
    """Whether the judged implementation's sdpa signature takes the keyword ``name`` (True when unknown)."""
    keywords = ACTIVE[-1].keywords if ACTIVE else None
    return keywords is None or name in keywords


def without_keyword(strategy, name: str, default):
    """``strategy`` kept to ``default`` when the signature lacks keyword ``name``: a case passing it would only be
    unsupported (Flax's dot_product_attention has no scale: 1336 such cases a run were drawn, called and dropped).
    A property that always passes the keyword is outside the implementation's reach."""
    if signature_takes(name):
        return strategy
    if not admits(strategy, default):
        outside_region(f"the property passes {name}, which the signature lacks")
    return st.just(default)


def variant_allowed(name: str) -> bool:
    """Whether the judged implementation runs the variant keyword ``name`` (its region and its signature)."""
    drawing = ACTIVE[-1]
    return drawing.region.allows_variant(name) and (drawing.keywords is None or name in drawing.keywords)


def lengths_in_order(lq: int, lk: int, region: Region, is_causal: bool) -> tuple[int, int]:
    """(Lq, Lk) swapped where a causal case must meet the region's declared relation (causal "lq<=lk", say)."""
    if is_causal and not causal_lengths_ok(region.causal_lengths, lq, lk):
        return (lk, lq) if region.causal_lengths != "lq==lk" else (min(lq, lk), min(lq, lk))
    return lq, lk


def equal_lengths(region: Region, is_causal: bool) -> bool:
    """Whether the region takes only Lq == Lk cases (all of them, or causal ones)."""
    return region.equal_lengths or (is_causal and region.causal_lengths == "lq==lk")


def scales_inside(scales, region: Region):
    """The property's scale strategy kept to the region's declared sign (unchanged where any scale is taken). A
    strategy of a few values becomes those of the sign, which the covering set can still build from."""
    if region.scale == "any":
        return scales
    kept = _of_sign(scales, region.scale)
    if kept is None:
        outside_region(f"the property draws no scale of the declared sign ({region.scale!r})")
    return kept


def _of_sign(scales, sign: str):
    """``scales`` kept to ``sign`` branch by branch (None: it has no such value)."""
    inner = unwrap(scales)
    if isinstance(inner, OneOfStrategy):
        branches = [kept for kept in (_of_sign(b, sign) for b in inner.original_strategies) if kept is not None]
        return st.one_of(branches) if branches else None
    values = strategy_values(inner)
    if values is None:  # a float range: filtered as drawn
        return scales.filter(lambda value: scale_ok(sign, value))
    kept = [v for v in values if scale_ok(sign, v)]
    return st.sampled_from(kept) if kept else None


def small_shapes_inside(region: Region) -> bool:
    return all(region.head_dims.contains(d) for d in range(1, MAX_DIM + 1)) and all(
        region.lengths.contains(n) for n in range(1, MAX_LEN + 1))


def mask_class(kind: str) -> str:
    return "none" if kind == "none" else ("float" if kind.startswith("float") else "bool")


def kernel_lengths(draw, region: Region, budget_per_pair: int, same_lengths: bool, lengths,
                    is_causal: bool = False, query_mode: str | None = None) -> tuple[int, int]:
    """(Lq, Lk) for a kernel-shaped case: decode, prefill or cross, crossing tile edges, within budget.

    Under the (top-left) causal band query i sees keys 0..i only, so a causal decode case
    would test v[0] alone and a short query block would never reach the last key tile:
    causal cases are prefill, or cross with Lq >= Lk.
    """
    candidates = region.lengths.members(KERNEL_SMALL_LENGTHS + KERNEL_EDGE_LENGTHS)
    if not candidates:
        top = region.lengths.max or 2048
        candidates = [n for n in range(region.lengths.min, top + 1, region.lengths.multiple)][:64]
    if lengths is not None:  # the property asks for lengths of its own (tile edges, say): honour those inside
        lq = draw(inside_range(lengths, region.lengths), label="Lq")
        lk = lq if same_lengths else draw(inside_range(lengths, region.lengths), label="Lk")
        return lq, lk
    modes = ("prefill", "cross") if is_causal else KERNEL_QUERY_MODES
    mode = query_mode or ("prefill" if same_lengths else draw(st.sampled_from(modes), label="query mode"))
    fitting = [n for n in candidates if n * n <= budget_per_pair] or candidates[:1]
    if mode == "prefill":
        n = draw(st.sampled_from(fitting), label="Lq = Lk")
        return n, n
    if mode == "decode":
        lq = draw(st.sampled_from(region.lengths.members((1, 2, 4)) or candidates[:1]), label="Lq (decode)")
        long_caches = region.lengths.members(DECODE_CACHE_LENGTHS) if query_mode == "decode" else []
        keys = [n for n in candidates + long_caches if lq * n <= budget_per_pair] or candidates[:1]
        if query_mode == "decode":  # the property is about a long cache: past one key tile of 64
            keys = [n for n in keys if n > 64] or keys
        return lq, draw(st.sampled_from(keys), label="Lk")
    # Cross: long query blocks (Lq past 128 and 256) against fewer keys, or the other way round.
    queries = [n for n in candidates if n * candidates[0] <= budget_per_pair] or candidates[:1]
    lq = draw(st.sampled_from(queries), label="Lq")
    keys = [n for n in candidates if lq * n <= budget_per_pair] or candidates[:1]
    lk = draw(st.sampled_from(keys), label="Lk")
    return (max(lq, lk), min(lq, lk)) if is_causal else (lq, lk)


def mask_shape(kind: str, b: int, hq: int, lq: int, lk: int) -> tuple[int, ...]:
    return {
        "bool-full": (b, hq, lq, lk),
        "float": (b, hq, lq, lk),
        "float-large": (b, 1, lq, lk),
        "bool-2d": (lq, lk),
        "key-padding": (b, 1, 1, lk),
        "per-head": (1, hq, lq, lk),
        "bool-query-keys": (b, 1, lq, lk),
        # Rank 3 aligns from the right (NumPy broadcasting): (Hq, Lq, Lk) is per head, not per batch.
        "bool-3d-per-head": (hq, lq, lk),
        "bool-3d-shared": (1, lq, lk),
        "float-3d": (hq, lq, lk),
        # Padded queries (a key axis of 1): rows i >= L[b] masked on every key.
        "query-padding": (b, 1, lq, 1),
    }[kind]


def build_mask(rng, kind, shape, lq, lk, is_causal, allow_empty_rows):
    """A mask of the given kind; unless empty rows are allowed, every row keeps one attendable key.

    A key-padding mask is, two times in three, one padded run per batch row as batched generation pads: left
    (keys < P masked, P < Lk) or right (keys >= L masked, L >= 1), else keys kept at random. Random keeps never
    mask a whole block of 64 keys (0.4^64): a kernel whose key loop stopped at the first block the mask removes
    ("the rest is padding") passed three default runs; left padding of a sequence past 64 keys has one."""
    if kind == "query-padding":  # rows i >= L[b] of a padded query batch, L[b] in 0..Lq; none without empty rows
        lengths = rng.integers(0, lq + 1, size=shape[:1] + (1, 1, 1))
        return np.arange(lq)[:, None] < lengths if allow_empty_rows else np.ones(shape, bool)
    layout = rng.integers(3) if kind == "key-padding" else 0
    if layout == 1 and is_causal and not allow_empty_rows:
        layout = 2  # left padding under the causal band empties the first rows: right padding keeps key 0
    if layout == 1:
        keep = np.arange(lk) >= rng.integers(0, lk, size=shape[:-1] + (1,))
    elif layout == 2:
        keep = np.arange(lk) < rng.integers(1, lk + 1, size=shape[:-1] + (1,))
    else:
        keep = rng.random(shape) < 0.6
    if not layout and not allow_empty_rows:
        # One guaranteed key per row of the mask (broadcast rows included), inside the causal band if causal.
        rows = np.arange(shape[-2])
        limit = np.minimum(rows, lk - 1) if (is_causal and shape[-2] == lq) else np.full(shape[-2], lk - 1)
        if is_causal and shape[-2] == 1:
            limit = np.zeros(1, dtype=int)  # a key-padding row is shared by every query, query 0 included
        chosen = (rng.random(shape[:-1]) * (limit + 1)).astype(int)
        np.put_along_axis(keep, chosen[..., None], True, axis=-1)
    if kind.startswith("float"):
        values = rng.standard_normal(shape) * (1.0 if kind == "float" else 0.5)
        fill = -np.inf if kind == "float" else rng.choice([-1e9, -1e4, -3e2])
        return np.where(keep, values, fill)
    return keep


def inside_range(sizes, allowed):
    """``sizes`` kept inside a region's IntRange. No filter where the range admits every size: Hypothesis reads
    a filter predicate's source to look for bounds (inspect.getsource, about 1 ms), once per strategy built,
    and these are built on every draw: that was a tenth of a property test's time."""
    if allowed.values is None and allowed.min <= 1 and allowed.max is None and allowed.multiple == 1:
        return sizes
    return sizes.filter(allowed.contains)


def hinted_lengths(region: Region, heads: int, same_lengths: bool, lengths, query_mode,
                    is_causal: bool = False) -> tuple[int, int] | None:
    """The covering corner's (Lq, Lk) when the property and the region admit it (None: draw them); a causal
    corner's pair is put in the order the region's causal relation declares."""
    pair = hint("lengths")
    if pair is None:
        return None
    lq, lk = lengths_in_order(*pair, region, is_causal)
    if same_lengths:
        lq = lk = max(lq, lk)
    if query_mode == "decode" and lq <= 4 and hint("long_cache"):
        past = [n for n in region.lengths.members(DECODE_CACHE_LENGTHS) if n > DECODE_CORNER_PAST
                and heads * lq * n <= COVERING_SCORE_BUDGET]
        lk = min(past, default=lk)
    fits = (region.lengths.contains(lq) and region.lengths.contains(lk) and heads * lq * lk <= COVERING_SCORE_BUDGET
            and (lengths is None or (admits(lengths, lq) and admits(lengths, lk)))
            and (query_mode != "decode" or (lq <= 4 and lk > 64))
            and (query_mode != "prefill" or lq == lk))
    return (lq, lk) if fits else None


def draw_is_causal(draw, causal, region: Region) -> bool:
    """The covering corner's is_causal where the property and the region admit it, else a drawn one; True in a
    region of causal cases only (SUPPORTS["causal"] "only"), where a property that holds is_causal off is outside."""
    if region.causal_only:
        return causal_only_case(draw, causal)
    wanted = hint("is_causal")
    return wanted if admits(causal, wanted) and (region.causal or not wanted) else draw(causal, label="is_causal")


def causal_only_case(draw, causal) -> bool:
    """is_causal in a region of causal cases only: True where the property's strategy ``causal`` admits it (not
    drawn), else the case is outside the region."""
    if admits(causal, True) or draw(causal, label="is_causal"):
        return True
    outside_region("is_causal=False (declared causal: 'only')")


def draw_mask_kind(draw, kinds: list[str]) -> str:
    """The covering corner's mask kind where the property draws it, else its ``mask``-th kind, else a drawn one (a
    corner about its mask kind alone, ``mask_only``, is not built where the property does not draw that kind)."""
    if hint("mask_kind") in kinds:
        return hint("mask_kind")
    if hint("mask_only"):
        raise CannotBuild(f"the corner is about mask kind {hint('mask_kind')!r}, which this property does not draw")
    if hint("mask") is not None:
        return kinds[hint("mask") % len(kinds)]
    return draw(st.sampled_from(kinds), label="mask")


def runs_variant(name: str) -> bool:
    """variant_allowed for a name of VARIANTS or SINK_FEATURES ("lengths" passes key_lengths, query_lengths too)."""
    return variant_allowed("key_lengths" if name == "lengths" else name)

"""Every Hypothesis strategy of the suite, in one place.

Draws are labelled and sizes capped (MAX_* below) so each example stays cheap and a
failure shrinks to a small, readable case. Array values come from a drawn seed
(NumPy's generator): shrinking then works on shapes, masks and flags, which is
where attention bugs live, and a repro prints the values literally.
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from attention_conformance.implementations._region import EVERYTHING, Region, causal_lengths_ok, scale_ok, shape_facts

from . import oracle
from .cases import Case
from .covering import (COVERING_SCORE_BUDGET, CannotBuild, DeterministicDraw, OneOfStrategy, _unwrap, admits, hint,
                       hinted, strategy_values)

MAX_BATCH = 2
MAX_KV_HEADS = 2
MAX_GROUP = 3  # Hq / Hkv
MAX_LEN = 7
MAX_DIM = 6
# Standard deviation of q and k entries; scores then have std about SIGMA**2
# (default scale), so 32 gives scores around 1e3, where exp overflows unless the
# implementation subtracts the row maximum.
SCORE_SIGMAS = {"unit": 1.0, "moderate": 4.0, "large": 32.0}
MASK_KINDS = ("none", "bool-full", "bool-2d", "key-padding", "per-head", "bool-query-keys", "bool-3d-per-head",
              "bool-3d-shared", "float", "float-large", "float-3d")
# Lengths and head widths one short of, at and one past the tile sizes blocked kernels use
# (flash-attention's own tests sweep such pairs: seqlens (113, 203), (1023, 1024), widths 59, 111):
# a partial last tile that is dropped, read twice or masked wrongly shows here (and in the
# kernel-shaped cases below; the small ones stay below 8).
TILE_SIZES = (8, 16, 32, 64, 128)
TILE_EDGE_LENGTHS = st.sampled_from(sorted({t + d for t in TILE_SIZES for d in (-1, 0, 1)})) | st.integers(1, 130)
TILE_EDGE_DIMS = st.sampled_from([7, 8, 9, 15, 16, 17, 31, 33]) | st.integers(1, MAX_DIM)
# Kernel-shaped cases (the shapes flash, cuDNN, flex and Pallas kernels run): head dims 16..256,
# the common ones first (Hypothesis shrinks towards the front of a sampled list); lengths one short
# of, at and one past the 64/128-multiples kernels tile by, up to 2k keys for decode (Lq 1); GQA
# groups up to 8. One case holds at most KERNEL_SCORE_BUDGET scores (B * Hq * Lq * Lk) so that the
# float64 oracle stays in milliseconds; realistic sizes beyond it are --large-shapes.
KERNEL_HEAD_DIMS = (64, 128, 80, 96, 256, 16, 32, 48, 112, 160, 192, 224, 40, 72, 24, 8)
KERNEL_EDGE_LENGTHS = tuple(sorted({t + d for t in (64, 128, 192, 256, 512, 1024, 2048) for d in (-1, 0, 1)}))
KERNEL_SMALL_LENGTHS = (1, 2, 3, 5, 8, 16, 17, 31, 32, 33)
KERNEL_GROUPS = (1, 2, 4, 8, 3, 5, 6, 7)
# The decode property's long caches, past the 4096 and 8192 keys a split-KV kernel may cap its splits at (a
# decode kernel whose splits stopped at key 4096 passed three default runs when caches ended at 2049): its
# long_cache covering corner takes the shortest past DECODE_CORNER_PAST that fits COVERING_SCORE_BUDGET, with head
# dims of at most DECODE_CORNER_MAX_DK (jax_numpy took 79 ms a call at Lk 4097, Dk 256, 17 ms at Dk 16, 259 ms at
# Lk 8193; a judged case 40-60 ms at Dk 64), its random draws those within their budget.
DECODE_CACHE_LENGTHS = (4095, 4096, 4097, 8191, 8192, 8193)
DECODE_CORNER_PAST = 4096
DECODE_CORNER_MAX_DK = 64
KERNEL_SCORE_BUDGET = 2**15
# Implementations that take the small shapes draw a kernel-shaped case one time in KERNEL_SHARE.
KERNEL_SHARE = 5
# A query of 1 (decode), a few (speculative decode), or as many as the keys (prefill) or any (cross).
KERNEL_QUERY_MODES = ("prefill", "decode", "cross")

@dataclass(frozen=True)
class DerivedCase:
    """A second case a property makes from the drawn one (or the drawn case as the test changes it before its
    first call), told by the facts it changes. It must lie inside the region as the drawn case does: a property
    whose derived case no drawn case could keep inside does not apply (conformance/properties.py, decided at
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


_ACTIVE: list[_Drawing] = [_Drawing(EVERYTHING, {}, (), None)]


@contextlib.contextmanager
def drawing_inside(region: Region, facts: dict | None = None, derived=(), keywords=None):
    """Draw every case inside ``region`` (the judged implementation's SUPPORTS) while active.

    ``facts`` (dtype, device) complete a drawn case's facts for the implementation's supports(facts);
    ``derived``: the property's DerivedCases, each of which must lie inside too; ``keywords``: the sdpa
    keywords the signature accepts (variant keywords it lacks are not drawn where a property leaves them optional).
    Yields the drawing, whose ``most_refused()`` says why draws were filtered out.
    """
    drawing = _Drawing(region, dict(facts or {}), tuple(derived), None if keywords is None else frozenset(keywords))
    _ACTIVE.append(drawing)
    try:
        yield drawing
    finally:
        _ACTIVE.pop()


def active_region() -> Region:
    return _ACTIVE[-1].region


def _outside_region(reason: str):
    """The drawn property cannot produce a case inside the region: unsupported, never failed."""
    from .checks import unsupported

    unsupported(f"outside the declared region: {reason}")


def _keep_inside(draw, facts: dict) -> None:
    """Filter out a draw whose case, or a derived case of the property, the region refuses (supports(facts)
    above all: the declared keys are met by construction). Inside Hypothesis the draw is rejected (``assume``:
    counted as filtered, never called, never an "unsupported" record); a covering corner is not built."""
    drawing = _ACTIVE[-1]
    facts = {**facts, **drawing.facts}
    reason = drawing.region.why_outside(facts)
    for derived in drawing.derived:
        if reason:
            break
        outside = drawing.region.why_outside(derived.facts(facts))
        reason = outside and f"derived case leaves the region: {derived.what}: {outside}"
    if not reason:
        return
    from .checks import LAST_UNSUPPORTED  # checks imports this module

    drawing.refused[reason] += 1
    LAST_UNSUPPORTED[0] = reason if reason.startswith("derived") else f"outside the declared region: {reason}"
    if isinstance(draw, DeterministicDraw):
        raise CannotBuild(reason)
    assume(False)


def keep_inside_region(draw, case: Case) -> None:
    """``_keep_inside`` for a case a strategy outside this module built (dropout's, gradients' own cases)."""
    _keep_inside(draw, shape_facts(case.op, case.inputs))


def _signature_takes(name: str) -> bool:
    """Whether the judged implementation's sdpa signature takes the keyword ``name`` (True when unknown)."""
    keywords = _ACTIVE[-1].keywords if _ACTIVE else None
    return keywords is None or name in keywords


def _without_keyword(strategy, name: str, default):
    """``strategy`` kept to ``default`` when the signature lacks keyword ``name``: a case passing it would only be
    unsupported (Flax's dot_product_attention has no scale: 1336 such cases a run were drawn, called and dropped).
    A property that always passes the keyword is outside the implementation's reach."""
    if _signature_takes(name):
        return strategy
    if not admits(strategy, default):
        _outside_region(f"the property passes {name}, which the signature lacks")
    return st.just(default)


def variant_allowed(name: str) -> bool:
    """Whether the judged implementation runs the variant keyword ``name`` (its region and its signature)."""
    drawing = _ACTIVE[-1]
    return drawing.region.allows_variant(name) and (drawing.keywords is None or name in drawing.keywords)


def _lengths_in_order(lq: int, lk: int, region: Region, is_causal: bool) -> tuple[int, int]:
    """(Lq, Lk) swapped where a causal case must meet the region's declared relation (causal "lq<=lk", say)."""
    if is_causal and not causal_lengths_ok(region.causal_lengths, lq, lk):
        return (lk, lq) if region.causal_lengths != "lq==lk" else (min(lq, lk), min(lq, lk))
    return lq, lk


def _equal_lengths(region: Region, is_causal: bool) -> bool:
    """Whether the region takes only Lq == Lk cases (all of them, or causal ones)."""
    return region.equal_lengths or (is_causal and region.causal_lengths == "lq==lk")


def _scales_inside(scales, region: Region):
    """The property's scale strategy kept to the region's declared sign (unchanged where any scale is taken). A
    strategy of a few values becomes those of the sign, which the covering set can still build from."""
    if region.scale == "any":
        return scales
    kept = _of_sign(scales, region.scale)
    if kept is None:
        _outside_region(f"the property draws no scale of the declared sign ({region.scale!r})")
    return kept


def _of_sign(scales, sign: str):
    """``scales`` kept to ``sign`` branch by branch (None: it has no such value)."""
    inner = _unwrap(scales)
    if isinstance(inner, OneOfStrategy):
        branches = [kept for kept in (_of_sign(b, sign) for b in inner.original_strategies) if kept is not None]
        return st.one_of(branches) if branches else None
    values = strategy_values(inner)
    if values is None:  # a float range: filtered as drawn
        return scales.filter(lambda value: scale_ok(sign, value))
    kept = [v for v in values if scale_ok(sign, v)]
    return st.sampled_from(kept) if kept else None


def _small_shapes_inside(region: Region) -> bool:
    return all(region.head_dims.contains(d) for d in range(1, MAX_DIM + 1)) and all(
        region.lengths.contains(n) for n in range(1, MAX_LEN + 1))


def _mask_class(kind: str) -> str:
    return "none" if kind == "none" else ("float" if kind.startswith("float") else "bool")


def _kernel_lengths(draw, region: Region, budget_per_pair: int, same_lengths: bool, lengths,
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
        lq = draw(_inside(lengths, region.lengths), label="Lq")
        lk = lq if same_lengths else draw(_inside(lengths, region.lengths), label="Lk")
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


SCALES = st.one_of(
    st.none(),
    st.sampled_from([0.0, 1.0, -1.0, 0.125, -0.35, 2.5]),
    st.floats(-3, 3, allow_nan=False, allow_infinity=False, width=32),
)


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


def _build_mask(rng, kind, shape, lq, lk, is_causal, allow_empty_rows):
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


def _inside(sizes, allowed):
    """``sizes`` kept inside a region's IntRange. No filter where the range admits every size: Hypothesis reads
    a filter predicate's source to look for bounds (inspect.getsource, about 1 ms), once per strategy built,
    and these are built on every draw: that was a tenth of a property test's time."""
    if allowed.values is None and allowed.min <= 1 and allowed.max is None and allowed.multiple == 1:
        return sizes
    return sizes.filter(allowed.contains)


def _hinted_lengths(region: Region, heads: int, same_lengths: bool, lengths, query_mode,
                    is_causal: bool = False) -> tuple[int, int] | None:
    """The covering corner's (Lq, Lk) when the property and the region admit it (None: draw them); a causal
    corner's pair is put in the order the region's causal relation declares."""
    pair = hint("lengths")
    if pair is None:
        return None
    lq, lk = _lengths_in_order(*pair, region, is_causal)
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


@st.composite
def sdpa_cases(
    draw,
    *,
    mask_kinds=MASK_KINDS,
    causal=st.booleans(),
    scale=SCALES,
    gqa: bool = True,
    same_dims: bool = False,
    same_lengths: bool = False,
    sigmas=tuple(SCORE_SIGMAS),
    allow_empty_rows: bool = False,
    clauses=("sdpa.definition",),
    bottom_right_mask: bool = False,
    lengths=None,
    dims=None,
    kv_heads=None,
    groups=None,
    query_mode: str | None = None,
    outermost: bool = True,
) -> Case:
    """An sdpa case inside the active region (drawing_inside): small shapes, or kernel-shaped ones.

    ``lengths``, ``dims``, ``kv_heads`` and ``groups`` override the shape draws of a
    property (None: the mode's own); a kernel-shaped case keeps the property's lengths,
    heads and groups where the region allows them, and its head dims where the region takes
    the small shapes (else it draws them from the region's kernel head dims).
    ``query_mode`` ("decode", "prefill", "cross") makes every case kernel-shaped in that mode.
    ``outermost``: False where another strategy builds on the case (variant_cases), which then asks the region.
    """
    region = active_region()
    scale = _scales_inside(_without_keyword(scale, "scale", None), region)
    causal = _without_keyword(causal, "is_causal", False)
    kinds = [k for k in mask_kinds if _mask_class(k) in region.masks and (k == "none" or _signature_takes("mask"))]
    if bottom_right_mask and "bool" not in region.masks:
        kinds = []
    if not kinds and not _signature_takes("mask") and any(k != "none" for k in mask_kinds):
        _outside_region("the property passes a mask, which the signature lacks")
    if not kinds:
        needed = {"bool"} if bottom_right_mask else {_mask_class(k) for k in mask_kinds}
        _outside_region(f"the property needs a {'/'.join(sorted(needed))} mask "
                        f"(declared masks: {', '.join(region.masks)})")
    # A covering corner (conformance/covering.py) hints its structure; a hint the property's own strategy does not
    # admit is not taken. Random draws see no hints.
    kernel = query_mode is not None or not _small_shapes_inside(region) or (
        hint("kernel") if hint("kernel") is not None
        else draw(st.integers(0, KERNEL_SHARE - 1), label="kernel-shaped") == 0)
    b = draw(st.integers(1, MAX_BATCH), label="B") if hint("B") is None else hint("B")
    if kv_heads is None:
        kv_heads = st.sampled_from((1, 2)) if kernel else st.integers(1, MAX_KV_HEADS)
    hkv = hint("Hkv") if hint("Hkv") is not None and admits(kv_heads, hint("Hkv")) else draw(kv_heads, label="Hkv")
    group = 1
    if gqa:
        groups = (st.sampled_from(KERNEL_GROUPS) if kernel else st.integers(1, MAX_GROUP)) if groups is None else groups
        wanted = hint("group")
        group = wanted if wanted is not None and admits(groups, wanted) else draw(groups, label="Hq/Hkv")
    if group > 1 and (not region.gqa or (region.max_group is not None and group > region.max_group)):
        if groups is not None:  # the property is about this group size
            _outside_region(f"Hq/Hkv = {group} (declared gqa: {region.gqa}, max_group: {region.max_group})")
        group = 1 if not region.gqa else min(group, region.max_group)
    hq = hkv * group
    is_causal = _is_causal(draw, causal, region)
    if is_causal and not region.causal:
        _outside_region("is_causal=True (declared causal: False)")
    if hint("causal_only") and not is_causal:
        raise CannotBuild("a corner about the causal band, in a property that holds is_causal off")
    same_lengths = same_lengths or _equal_lengths(region, is_causal)
    if same_lengths and query_mode == "decode":
        _outside_region("a decode case (Lq < Lk) where the region takes Lq == Lk only")
    corner_lengths = _hinted_lengths(region, b * hq, same_lengths, lengths, query_mode, is_causal)
    if corner_lengths:
        lq, lk = corner_lengths
    if kernel:
        if not corner_lengths:
            lq, lk = _kernel_lengths(draw, region, KERNEL_SCORE_BUDGET // (b * hq), same_lengths, lengths, is_causal,
                                     query_mode)
        if dims is not None and _small_shapes_inside(region):  # the property's own widths (tile edges) fit
            dims = _inside(dims, region.head_dims)
        else:
            dims = st.sampled_from(region.head_dims.members(KERNEL_HEAD_DIMS) or [region.head_dims.min])
    else:
        lengths = st.integers(1, MAX_LEN) if lengths is None else lengths
        if not corner_lengths:
            lq = draw(lengths, label="Lq")
            lk = lq if same_lengths else draw(lengths, label="Lk")
        dims = _inside(st.integers(1, MAX_DIM) if dims is None else dims, region.head_dims)
    lq, lk = _lengths_in_order(lq, lk, region, is_causal)
    if corner_lengths and lk > DECODE_CORNER_PAST:
        narrow = region.head_dims.members(tuple(d for d in KERNEL_HEAD_DIMS if d <= DECODE_CORNER_MAX_DK))
        dims = st.sampled_from(narrow) if narrow else dims
    dk = hint("Dk") if hint("Dk") is not None and admits(dims, hint("Dk")) else draw(dims, label="Dk")
    # Half the cases keep Dv == Dk, which many kernels require.
    wanted_dv = hint("Dv")
    if same_dims or region.same_value_dim or (wanted_dv == dk if wanted_dv is not None
                                               else draw(st.booleans(), label="Dv == Dk")):
        dv = dk
    else:
        dv = wanted_dv if wanted_dv is not None and admits(dims, wanted_dv) else draw(dims, label="Dv")
    kind = _mask_kind(draw, kinds)
    magnitudes = st.sampled_from(sigmas)
    sigma_name = hint("magnitude") if admits(magnitudes, hint("magnitude")) else draw(magnitudes,
                                                                                      label="score magnitude")
    chosen_scale = hint("scale") if hinted("scale") and admits(scale, hint("scale")) else draw(scale, label="scale")
    if outermost:  # the facts are known before any value is drawn: a refused draw costs no arrays
        _keep_inside(draw, {"op": "sdpa", "B": b, "Hq": hq, "Hkv": hkv, "Lq": lq, "Lk": lk, "Dk": dk, "Dv": dv,
                            "is_causal": bool(is_causal), "scale": chosen_scale, "variants": (),
                            "mask_kind": "bool" if bottom_right_mask else _mask_class(kind)})
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    # Raw dot products grow like sqrt(Dk): past the small dims, q and k shrink by (MAX_DIM / Dk)^(1/4) so an explicit
    # scale keeps scores in the magnitude class drawn (16-bit scores of a large class near 1e4, not past float16's
    # 65504, which is a range limit of the dtype rather than of the attention).
    sigma = SCORE_SIGMAS[sigma_name] * min(1.0, (MAX_DIM / dk) ** 0.25)
    inputs = {
        "q": rng.standard_normal((b, hq, lq, dk)) * sigma,
        "k": rng.standard_normal((b, hkv, lk, dk)) * sigma,
        "v": rng.standard_normal((b, hkv, lk, dv)),
    }
    if kind != "none":
        inputs["mask"] = _build_mask(rng, kind, mask_shape(kind, b, hq, lq, lk), lq, lk, is_causal, allow_empty_rows)
    if bottom_right_mask:
        inputs["mask"] = oracle.causal_allowed(lq, lk, bottom_right=True)
        kind = "bottom-right"
    if is_causal:
        inputs["is_causal"] = True
    if chosen_scale is not None:
        inputs["scale"] = float(chosen_scale)
    label = (
        f"B{b} Hq{hq}/Hkv{hkv} Lq{lq} Lk{lk} Dk{dk} Dv{dv} mask={kind}{' causal' if is_causal else ''}"
        f" scale={chosen_scale} scores~{sigma_name} seed={seed}"
    )
    return Case("sdpa", inputs, tuple(clauses), label, mask_kind=kind)


@st.composite
def softmax_cases(draw, *, clauses=("softmax.definition",), sigmas=tuple(SCORE_SIGMAS), neg_inf: bool = False,
                  axis=st.sampled_from([-1, -2, 0, 1])) -> Case:
    ndim = draw(st.integers(1, 3), label="ndim")
    shape = list(draw(st.lists(st.integers(1, MAX_LEN), min_size=ndim, max_size=ndim), label="shape"))
    chosen_axis = draw(axis, label="axis")
    if not -ndim <= chosen_axis < ndim:
        chosen_axis = -1
    # One case in three softmaxes a long axis: vectorised kernels process 8, 16, 32 ... lanes at a time, and a
    # wrong tail (the last partial vector) shows only past those widths.
    corner = hint("index")
    if corner is not None and corner < len(SOFTMAX_CORNER_LENGTHS):
        # The first covering corners (conformance/covering.py) are rows past the widths a kernel chunks at, several
        # of them: a chunked path errs only in rows whose maximum lies past the first chunk.
        chosen_axis = -1 if ndim == 1 else chosen_axis
        shape = [SOFTMAX_CORNER_ROWS] * max(ndim, 2)
        shape[chosen_axis] = SOFTMAX_CORNER_LENGTHS[corner]
    elif draw(st.integers(0, 2), label="long axis") == 0:
        shape[chosen_axis] = draw(st.sampled_from(SOFTMAX_EDGE_LENGTHS) | st.integers(8, MAX_SOFTMAX_AXIS),
                                  label="axis length")
    shape = tuple(shape)
    sigma = SCORE_SIGMAS[draw(st.sampled_from(sigmas), label="magnitude")] ** 2
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * sigma
    if neg_inf:
        hole = rng.random(shape) < 0.4
        keep = np.argmax(rng.random(shape), axis=chosen_axis)  # one finite entry per slice
        np.put_along_axis(hole, np.expand_dims(keep, chosen_axis), False, axis=chosen_axis)
        x = np.where(hole, -np.inf, x)
    inputs = {"x": x}
    if chosen_axis != -1:
        inputs["axis"] = chosen_axis
    label = f"shape{shape} axis={chosen_axis} magnitude={sigma:g}{' with -inf' if neg_inf else ''} seed={seed}"
    return Case("softmax", inputs, tuple(clauses), label)


BIAS_KINDS = ("none", "input", "output", "all")
MAX_SOFTMAX_AXIS = 300
# Vector widths, and the 1024..4096-long rows a softmax kernel may switch to a chunked (online) path for: one whose
# chunks' running sum was not rescaled when the maximum grew passed three default runs when rows ended at 300.
SOFTMAX_CORNER_LENGTHS = (2049, 1025)
SOFTMAX_CORNER_ROWS = 4
SOFTMAX_EDGE_LENGTHS = tuple(sorted({w + d for w in (8, 16, 32, 64, 128, 256, 1024, 2048, 4096) for d in (-1, 0, 1)}))


def _is_causal(draw, causal, region: Region) -> bool:
    """The covering corner's is_causal where the property and the region admit it, else a drawn one."""
    wanted = hint("is_causal")
    return wanted if admits(causal, wanted) and (region.causal or not wanted) else draw(causal, label="is_causal")


def _mask_kind(draw, kinds: list[str]) -> str:
    """The covering corner's mask kind where the property draws it, else its ``mask``-th kind, else a drawn one (a
    corner about its mask kind alone, ``mask_only``, is not built where the property does not draw that kind)."""
    if hint("mask_kind") in kinds:
        return hint("mask_kind")
    if hint("mask_only"):
        raise CannotBuild(f"the corner is about mask kind {hint('mask_kind')!r}, which this property does not draw")
    if hint("mask") is not None:
        return kinds[hint("mask") % len(kinds)]
    return draw(st.sampled_from(kinds), label="mask")


@st.composite
def mha_cases(draw, *, clauses=("mha.projections",), bias=st.sampled_from(BIAS_KINDS), cross=st.booleans(),
              mask_kinds=("none", "bool-2d", "key-padding", "float"), causal=st.booleans(),
              min_heads: int = 1, min_len: int = 1, head_width_free: bool = False,
              allow_empty_rows: bool = False) -> Case:
    region = active_region()
    kinds = [k for k in mask_kinds if _mask_class(k) in region.masks]
    if not kinds:
        _outside_region(f"the property needs a mask (declared masks: {', '.join(region.masks)})")
    # The per-head attention inside must lie in the region: kernel-shaped head widths where small ones are outside.
    kernel = not _small_shapes_inside(region)
    # A covering corner's batch, lengths, causal band and mask are taken where the property admits them (without
    # them every MHA corner was Hypothesis's simplest case: batch 1, one query, one key, the first mask kind).
    b = hint("B") if hint("B") is not None else draw(st.integers(1, MAX_BATCH), label="B")
    h = draw(st.integers(min_heads, 3), label="H")
    length_choices = region.lengths.members(range(max(min_len, 1), MAX_LEN + 1)) or region.lengths.members(
        KERNEL_SMALL_LENGTHS + KERNEL_EDGE_LENGTHS)[:1] or [region.lengths.min]
    corner = hint("lengths") if hint("lengths") is not None and set(hint("lengths")) <= set(length_choices) else None
    if corner is not None:  # two lengths are a cross-attention case where the property admits one
        lq, wants_cross = corner[0], corner[0] != corner[1] and not region.equal_lengths
        is_cross = wants_cross if admits(cross, wants_cross) else not wants_cross
        lk = corner[1] if is_cross and not region.equal_lengths else lq
    else:
        lq = draw(st.sampled_from(length_choices), label="Lq")
        is_cross = draw(cross, label="cross-attention")
        lk = draw(st.sampled_from(length_choices), label="Lk") if is_cross and not region.equal_lengths else lq
    if head_width_free and region.mha_head_width_e_over_h:
        _outside_region("a head width other than E / H (declared mha_head_width: 'e_over_h')")
    if kernel:
        dk = dv = draw(st.sampled_from(region.head_dims.members((16, 32, 64, 24, 48, 8, 128)) or [region.head_dims.min]),
                       label="head D")
        e = h * dk + (1 if head_width_free else 0)
        e_kv = draw(st.sampled_from([e, e + 1]), label="E_kv") if is_cross else e
    # Half the cases use the common layout (head width E / H for q, k and v, as in
    # nn.MultiheadAttention), so an implementation limited to it is not starved of cases.
    elif not head_width_free and (region.mha_head_width_e_over_h or draw(st.booleans(), label="head width E / H")):
        dk = dv = draw(st.integers(1, 3), label="head D")
        e = h * dk
        e_kv = draw(st.sampled_from([e, e + 1]), label="E_kv") if is_cross else e
    else:
        e = draw(st.integers(1, 8), label="E")
        e_kv = draw(st.integers(1, 8), label="E_kv") if is_cross else e
        dk = draw(st.integers(1, 4), label="head Dk")
        dv = dk if region.same_value_dim else draw(st.integers(1, 4), label="head Dv")
    if head_width_free and h * dk == e:
        e += 1  # keep the head width away from E / H
        e_kv = e_kv if is_cross else e
    with_bias = draw(bias, label="bias")  # which projections carry a bias
    is_causal = _is_causal(draw, causal, region)
    if is_causal and not region.causal:
        _outside_region("is_causal=True (declared causal: False)")
    lq, lk = _lengths_in_order(lq, lk, region, is_causal)
    kind = _mask_kind(draw, kinds)
    _keep_inside(draw, {"op": "multi_head_attention", "B": b, "Hq": h, "Hkv": h, "Lq": lq, "Lk": lk, "Dk": dk,
                        "Dv": dv, "E": e, "E_k": e_kv, "E_v": e_kv, "E_out": e, "is_causal": bool(is_causal),
                        "mask_kind": _mask_class(kind)})
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, lq, e))
    kv = rng.standard_normal((b, lk, e_kv)) if is_cross else x
    # value is its own tensor in every cross-attention case and in half the others, so projecting value from the
    # key input fails; the other half keeps value = key = query for implementations that only do self-attention.
    value = rng.standard_normal(kv.shape) if is_cross or draw(st.booleans(), label="value distinct") else kv
    params = {
        "w_q": rng.standard_normal((e, h * dk)) / np.sqrt(e),
        "w_k": rng.standard_normal((e_kv, h * dk)) / np.sqrt(e_kv),
        "w_v": rng.standard_normal((e_kv, h * dv)) / np.sqrt(e_kv),
        "w_o": rng.standard_normal((h * dv, e)) / np.sqrt(h * dv),
    }
    biased = {"none": "", "input": "qkv", "output": "o", "all": "qkvo"}[with_bias]
    params.update({f"b_{n}": rng.standard_normal(params[f"w_{n}"].shape[1]) for n in biased})
    inputs = {"query": x, "key": kv, "value": value, "params": params, "num_heads": h}
    if kind != "none":
        inputs["mask"] = _build_mask(rng, kind, mask_shape(kind, b, h, lq, lk), lq, lk, is_causal, allow_empty_rows)
    if is_causal:
        inputs["is_causal"] = True
    label = (f"B{b} H{h} Lq{lq} Lk{lk} E{e} E_kv{e_kv} Dk{dk} Dv{dv} bias={with_bias} mask={kind}"
             f"{' causal' if is_causal else ''} seed={seed}")
    return Case("multi_head_attention", inputs, tuple(clauses), label, mask_kind=kind)


# ------------------------------------------------------------------ outlier channels
# Activations with an outlier feature (LLM.int8(), Dettmers et al. 2022; "massive activations", Sun et al. 2024): one
# channel of q and of k hundreds of times the others. The unscaled product q.k then passes float16's largest value
# (65504) while scale * q.k stays inside it: an implementation that rounds q @ k^T to float16 before the scale gets
# inf, then NaN (Hugging Face's eager attention computes q @ k^T, then * scaling); one that scales q first, or scales
# in its float32 accumulator, stays finite. Only float16's range is so narrow: in bfloat16 and float32, whose range
# is float32's, the scaled score would overflow too.
OUTLIER_UNSCALED_SCORE = 1.5 * 65504.0  # the largest |q.k| of a case: the outlier channel's product
OUTLIER_HEAD_DIMS = (16, 32, 64, 128)  # scale 1/sqrt(Dk) <= 1/4: |scale q.k| <= 2.5e4, inside float16's range
# A kernel-shaped case takes its region's kernel head dims instead (cuDNN's include 8: |scale q.k| <= 3.5e4, a row's
# scores spanning 6.9e4, which found torch's cuDNN holding removed keys at a finite fill; README "GPU"). Below Dk 4 the
# product shrinks so that |scale q.k| stays at most OUTLIER_SCALED_SCORE: a case float16 cannot hold is no case.
OUTLIER_SCALED_SCORE = 0.75 * 65504.0


@st.composite
def outlier_channel_cases(draw, *, clauses=("sdpa.score-range", "sdpa.finite")) -> Case:
    """An sdpa case (default scale, no mask or key padding) whose q and k carry one outlier channel: q's is
    sqrt(OUTLIER_UNSCALED_SCORE) in every row, k's that times +-1 per key."""
    case = draw(sdpa_cases(mask_kinds=("none", "key-padding"), scale=st.none(), dims=st.sampled_from(OUTLIER_HEAD_DIMS),
                           same_dims=True, clauses=clauses), label="base case")
    inputs = dict(case.inputs)
    q, k = inputs["q"].copy(), inputs["k"].copy()
    channel = draw(st.integers(0, q.shape[-1] - 1), label="outlier channel")
    signs = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="signs seed")).choice([-1.0, 1.0],
                                                                                              size=k.shape[:-1])
    product = min(OUTLIER_UNSCALED_SCORE, OUTLIER_SCALED_SCORE * math.sqrt(q.shape[-1]))
    size = math.sqrt(product)
    q[..., channel], k[..., channel] = size, size * signs
    inputs.update(q=q, k=k)
    return Case("sdpa", inputs, case.clauses, f"{case.label} outlier channel {channel} (|q.k| up to "
                f"{product:.3g})", mask_kind=case.mask_kind)


# ------------------------------------------------------------------ variants
# The sdpa variants of the contract (README, "The contract"; issue 17). A variant case is an sdpa case
# drawn as above (inside the active region, kernel-shaped where the region demands it) with variant
# keywords added, each drawn at its edges: windows of 0, past the length and one side unbounded; softcaps
# from strong saturation to no-op, relative to the case's own score magnitude; ALiBi slopes geometric
# (2^(-8h/H), Press et al.) or random over three decades, per head or per example and head; lengths 0, 1,
# full or between; offsets 0, Lk - Lq (bottom-right) or between.
VARIANTS = ("window", "softcap", "alibi_slopes", "query_offset", "lengths")
# softcap / (largest |scale q.k| of the case): 0.05 saturates every score, 50 is nearly no-op.
SOFTCAP_RATIOS = (0.05, 0.5, 1.0, 5.0, 50.0, 1e4)


def _window_side(length: int):
    """One side of a window: None (unbounded), 0, 1, past the length, or anything between."""
    return st.one_of(st.none(), st.sampled_from([0, 1, length, length + 3]), st.integers(0, max(length, 1)))


def _offsets(lq: int, lk: int):
    bottom_right = max(lk - lq, 0)
    return st.sampled_from(sorted({0, bottom_right})) | st.integers(0, max(bottom_right, 1))


def _lengths(limit: int):
    return st.sampled_from(sorted({0, 1, limit})) | st.integers(0, limit)


def _softcap(draw, top: float, words: list[str]) -> float:
    """A softcap of SOFTCAP_RATIOS times the case's largest |score| ``top``; its label word appended to ``words``."""
    ratio = draw(st.sampled_from(SOFTCAP_RATIOS), label="softcap / max |score|")
    # Kept within 1e-2 .. 6e4: a softcap a 16-bit implementation rounds to its dtype stays normal and finite.
    cap = float(np.clip(max(top, 1e-3) * ratio, 1e-2, 6e4))
    words.append(f"softcap={cap:.3g} ({ratio}x max score)")
    return cap


def _alibi_slopes(draw, b: int, hq: int, per_row: str, words: list[str]) -> np.ndarray:
    """ALiBi slopes: geometric (Hq,), random over three decades (Hq,), or random per example / sequence (B, Hq) (the
    form named ``per_row``); the label word appended to ``words``."""
    form = draw(st.sampled_from(["geometric", "random", per_row]), label="ALiBi slopes")
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="slopes seed"))
    words.append(f"alibi={form}")
    if form == "geometric":  # Press et al.: 2^(-8h/H), h = 1..H
        return 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)
    return 10.0 ** rng.uniform(-3, 0, size=(b, hq) if form == per_row else (hq,))  # mixed magnitudes, 1e-3 .. 1


def _draw_variant_keywords(draw, inputs: dict, variants) -> list[str]:
    """The keywords of ``variants`` (names of VARIANTS) drawn at their edges for the sdpa-shaped ``inputs`` (q, k,
    scale; put in them, in this order); their labels."""
    q, k = inputs["q"], inputs["k"]
    b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
    words = []
    if "query_offset" in variants:
        offset = draw(_offsets(lq, lk), label="query_offset")
        inputs["query_offset"] = offset
        words.append(f"offset={offset}")
    if "window" in variants:
        if hint("window") is not None:  # a corner's window; "past": a side beyond every query-key distance
            beyond = inputs.get("query_offset", 0) + lq + lk
            window = tuple(beyond if side == "past" else side for side in hint("window"))
        else:
            window = (draw(_window_side(lk), label="window left"), draw(_window_side(lk), label="window right"))
        inputs["window"] = window
        words.append(f"window={window}")
    if "softcap" in variants:
        scale_value = inputs.get("scale", q.shape[-1] ** -0.5)
        top = float(np.max(np.abs(q @ np.swapaxes(oracle.repeat_kv_heads(k, q.shape[1]), -1, -2) * scale_value),
                           initial=0.0))
        inputs["softcap"] = _softcap(draw, top, words)
    if "alibi_slopes" in variants:
        inputs["alibi_slopes"] = _alibi_slopes(draw, b, q.shape[1], "per-example", words)
    if "lengths" in variants:
        inputs["key_lengths"] = np.array([draw(_lengths(lk), label="key length") for _ in range(b)], dtype=np.int32)
        words.append(f"key_lengths={inputs['key_lengths'].tolist()}")
        if variant_allowed("query_lengths") and draw(st.booleans(), label="query lengths"):
            inputs["query_lengths"] = np.array([draw(_lengths(lq), label="query length") for _ in range(b)],
                                               dtype=np.int32)
            words.append(f"query_lengths={inputs['query_lengths'].tolist()}")
    return words


@st.composite
def variant_cases(draw, *, variants=VARIANTS, clauses=("sdpa.variant-order",), mask_kinds=("none",),
                  causal=st.booleans(), gqa: bool = True, scale=st.none(), same_lengths: bool = False,
                  outermost: bool = True, optional=(), **base) -> Case:
    """An sdpa case using the variant keywords named in ``variants`` (each always used) on a case of sdpa_cases.

    ``variants``: names of VARIANTS; "lengths" draws key_lengths and, half the time, query_lengths (where the
    implementation runs them: its declared variants and its signature). ``optional``: names of VARIANTS each always
    used where the implementation runs it, left out where it does not (a window property still judges the window of
    an implementation without query_offset, at offset 0).
    ``base``: further keywords of sdpa_cases. ``outermost``: False where another strategy adds keywords to the
    case (sink_chunk_leftpad_cases), which then asks the region.
    """
    case = draw(sdpa_cases(mask_kinds=mask_kinds, causal=causal, gqa=gqa, scale=scale, same_lengths=same_lengths,
                           clauses=clauses, allow_empty_rows=True, outermost=False, **base), label="base case")
    inputs = dict(case.inputs)
    words = _draw_variant_keywords(draw, inputs, tuple(variants) + tuple(v for v in optional if _runs_variant(v)))
    if outermost:
        _keep_inside(draw, shape_facts("sdpa", inputs))
    return Case("sdpa", inputs, case.clauses, f"{case.label} {' '.join(words)}", mask_kind=case.mask_kind)


# ------------------------------------------------------------------ variants of issue 25
# Learnable attention sinks, sink tokens, chunked local attention and left padding (README "The contract";
# spec/clauses.yaml sdpa.learnable-sink ... sdpa.key-leftpad), each drawn at its edges on a case of variant_cases:
# sink logits above a row's scores, among them, far below them (no effect) or mixed across heads, also on
# rows without keys; chunks of 1, 2, a few, the key length and past it; sink tokens 1 .. Lk beside a window whose
# left edge is bounded (without one they change nothing); left paddings of 0, 1, Lk (every key padding) or one that
# leaves real keys to the last query row.
SINK_FEATURES = ("learnable_sink", "sink_token_length", "attention_chunk", "key_leftpad")
SINK_FORMS = ("above", "among", "below", "mixed")
SINK_FORMS_THAT_MATTER = ("above", "among", "mixed")


def _sink_logits(form: str, rng: np.random.Generator, scores: np.ndarray) -> np.ndarray:
    """(Hq,) sink logits placed against each head's own scores (B, Hq, Lq, Lk), -inf where a key is removed: above
    one of its rows' largest score by 0.5 .. 4 (that row's weights shrink by up to e^-4, none vanishes), equal to one
    of its scores (comparable to the keys), or below its smallest by 20 .. 40 (the rows are unchanged); "mixed" draws
    a form per head. A head without keys gets a logit in [-3, 3]: its rows are 0 whatever the sink."""
    heads = scores.shape[1]
    forms = rng.choice(SINK_FORMS[:3], size=heads) if form == "mixed" else [form] * heads
    logits = np.empty(heads)
    for h, chosen in enumerate(forms):
        head = scores[:, h]
        finite = head[np.isfinite(head)]
        if finite.size == 0:
            logits[h] = rng.uniform(-3.0, 3.0)
            continue
        row_max = np.max(head, axis=-1)
        if chosen == "above":
            logits[h] = rng.choice(row_max[np.isfinite(row_max)]) + rng.uniform(0.5, 4.0)
        elif chosen == "among":
            logits[h] = rng.choice(finite)
        else:
            logits[h] = finite.min() - rng.uniform(20.0, 40.0)
    return logits


def _chunks(length: int):
    return st.sampled_from(sorted({1, 2, 3, max(length // 2, 1), max(length, 1), length + 1})) | st.integers(
        1, max(length, 1) + 2)


def _leftpads(length: int, inputs: dict, example: int):
    """A left padding: 0, 1 or all the keys, or one that leaves the example a real key before its end
    (key_lengths) and its last query row past the padding, as in a batch of left-padded prompts."""
    end = length if inputs.get("key_lengths") is None else int(inputs["key_lengths"][example])
    live = max(0, min(end - 1, int(inputs.get("query_offset", 0)) + inputs["q"].shape[2] - 1))
    return st.sampled_from(sorted({0, 1, length})) | st.integers(0, live)


def _sink_token_lengths(length: int):
    return st.sampled_from(sorted({1, 2, 4, max(length, 1)})) | st.integers(1, max(length, 1))


def _draw_sink_chunk_leftpad(draw, inputs: dict, features) -> list[str]:
    """The issue-25 keywords of ``features`` (SINK_FEATURES) drawn at their edges for the sdpa-shaped ``inputs``
    (q, k and the older keywords already drawn; put in them, in this order); their labels. The learnable sink comes
    last: it is placed against the scores every other keyword leaves."""
    q, k = inputs["q"], inputs["k"]
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    words = []
    if "sink_token_length" in features:
        left, right = inputs.get("window") or (None, None)
        if left is None:
            left = draw(st.sampled_from([0, 1, lk, lk + 3]) | st.integers(0, max(lk, 1)), label="window left")
            inputs["window"] = (left, right)
            words.append(f"window={inputs['window']}")
        inputs["sink_token_length"] = draw(_sink_token_lengths(lk), label="sink_token_length")
        words.append(f"sink_tokens={inputs['sink_token_length']}")
    if "attention_chunk" in features:
        inputs["attention_chunk"] = draw(_chunks(lk), label="attention_chunk")
        words.append(f"chunk={inputs['attention_chunk']}")
    if "key_leftpad" in features:
        inputs["key_leftpad"] = np.array([draw(_leftpads(lk, inputs, example), label="key leftpad")
                                          for example in range(b)], dtype=np.int32)
        words.append(f"key_leftpad={inputs['key_leftpad'].tolist()}")
    if "learnable_sink" in features:
        # A covering corner takes a form that changes its rows ("below" leaves them as they are): a split-KV decode
        # path that forgot the sink passed a run whose decode corner drew "below".
        forms = SINK_FORMS if hint("index") is None else SINK_FORMS_THAT_MATTER
        form = draw(st.sampled_from(forms), label="sink logits")
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="sink seed"))
        scores = oracle.scores(q, k, inputs.get("mask"), inputs.get("is_causal", False), inputs.get("scale"),
                               **oracle.variant_options(inputs))
        inputs["learnable_sink"] = _sink_logits(form, rng, np.broadcast_to(scores, (b, hq, lq, lk)))
        words.append(f"sink={form}")
    return words


@st.composite
def sink_chunk_leftpad_cases(draw, *, features=SINK_FEATURES, variants=(), optional=(),
                             clauses=("sdpa.learnable-sink",), mask_kinds=("none",), causal=st.booleans(),
                             **base) -> Case:
    """An sdpa case using the issue-25 keywords named in ``features`` (each always used; SINK_FEATURES) on a case
    of variant_cases with the older variant keywords ``variants`` and ``optional`` (VARIANTS; as variant_cases
    takes them). With sink_token_length, a window whose left edge is unbounded gets a bounded one (the sink tokens'
    only effect). ``base``: further keywords of variant_cases / sdpa_cases."""
    case = draw(variant_cases(variants=variants, optional=optional, clauses=clauses, mask_kinds=mask_kinds,
                              causal=causal, outermost=False, **base), label="variant case")
    inputs = dict(case.inputs)
    words = _draw_sink_chunk_leftpad(draw, inputs, features)
    _keep_inside(draw, shape_facts("sdpa", inputs))  # with this case's own keywords among its variants
    return Case("sdpa", inputs, case.clauses, f"{case.label} {' '.join(words)}", mask_kind=case.mask_kind)


# ------------------------------------------------------------------ packed batches and paged KV caches (issue 25)
# sdpa_varlen and sdpa_paged (README "The contract"; spec/clauses.yaml varlen.*, paged.*): a batch of up to
# MAX_SEQUENCES sequences with their own query and key lengths, drawn at the corners real kernels get wrong: a
# sequence without queries or without keys, more queries than keys (rows the bottom-right band leaves without a key),
# a decode sequence, sequence boundaries off every tile; paged caches with pages shuffled across the pool, pages
# shared by two sequences, a last page partly filled or filled to its end (a page boundary at the last key), and
# large finite garbage everywhere no sequence's used keys are (slots past seqused_k, unused pages and table entries),
# so that a read past seqused_k shows. A covering corner (its "index") builds one of SEQUENCE_PATTERNS /
# PAGED_PATTERNS, each holding those corners together.
MAX_SEQUENCES = 4
MAX_SEQUENCE_LEN = 7
SEQUENCE_TILE_LENGTHS = (8, 9, 15, 16, 17)  # one sequence past a tile of 8 or 16, one time in four
GARBAGE_K_SIGMA, GARBAGE_V_SIGMA = 30.0, 100.0  # what lies where no used key is: a key read there dominates its row
SEQUENCE_VARIANT_NAMES = ("window", "softcap", "alibi_slopes", "learnable_sink")
# (Lq_b, Lk_b) per sequence; each pattern has an empty sequence and one with Lq_b != Lk_b. The third, the non-causal
# brief corner's (index 2), has a sequence with two more queries than any sequence has keys (_corner_window).
SEQUENCE_PATTERNS = (
    ((3, 5), (0, 4), (5, 2), (4, 0)),
    ((1, 7), (4, 0), (6, 3)),
    ((5, 2), (0, 0), (2, 3), (3, 3)),
    ((7, 7), (0, 3), (5, 2)),
    ((2, 2), (6, 1), (0, 5), (3, 0)),
)
# (block_size, seqused_k per sequence, Lq, shared pages): a page boundary at the last key of one sequence, a partial
# last page of another, an empty cache or more queries than keys.
# The non-causal brief corner's (index 2) has more queries than the block table holds keys, plus two
# (_corner_window).
PAGED_PATTERNS = (
    (2, (4, 3, 0), 3, True),
    (4, (5, 8, 1), 1, False),
    (2, (2, 1), 6, True),
    (1, (3, 0, 5), 2, True),
    (3, (3, 7), 5, True),
    (3, (6, 2), 4, True),
)


def _sequence_lengths(limit: int):
    return st.sampled_from(sorted({0, 1, limit})) | st.integers(0, limit)


def _sequence_heads(draw, region: Region) -> tuple[int, int]:
    """(Hkv, Hq) of a packed or paged case inside the region's GQA declaration (the corner's where it has one)."""
    hkv = hint("Hkv") if hint("Hkv") in (1, 2) else draw(st.integers(1, MAX_KV_HEADS), label="Hkv")
    group = hint("group") if hint("group") in (1, 2, 3) else draw(st.integers(1, MAX_GROUP), label="Hq/Hkv")
    if not region.gqa:
        group = 1
    elif region.max_group is not None:
        group = min(group, region.max_group)
    return hkv, hkv * group


def _sequence_dims(draw, region: Region) -> tuple[int, int]:
    """(Dk, Dv): small ones, or the region's kernel head dims."""
    dims = region.head_dims.members(range(1, MAX_DIM + 1)) or region.head_dims.members(KERNEL_HEAD_DIMS)[:4] \
        or [region.head_dims.min]
    dk = hint("Dk") if hint("Dk") in dims else draw(st.sampled_from(dims), label="Dk")
    if region.same_value_dim or draw(st.booleans(), label="Dv == Dk"):
        return dk, dk
    return dk, draw(st.sampled_from(dims), label="Dv")


def _sequence_options(draw, causal, scale) -> tuple[bool, float | None]:
    region = active_region()
    wanted = hint("is_causal")
    is_causal = wanted if wanted is not None and admits(causal, wanted) else draw(causal, label="is_causal")
    if is_causal and not region.causal:
        _outside_region("is_causal=True (declared causal: False)")
    scale = _scales_inside(scale, region)
    chosen = hint("scale") if hinted("scale") and admits(scale, hint("scale")) else draw(scale, label="scale")
    return bool(is_causal), chosen


def _sequence_values(draw, rng, shape, sigma_name: str, dk: int) -> np.ndarray:
    sigma = SCORE_SIGMAS[sigma_name] * min(1.0, (MAX_DIM / dk) ** 0.25)
    return rng.standard_normal(shape) * sigma


def _sequence_variants(draw, op: str, inputs: dict, variants, b: int, hq: int, max_keys: int) -> list[str]:
    """Draw the per-sequence variant keywords ``variants`` names (those the implementation runs) into ``inputs``;
    returns the label's words. Each is drawn at its edges as for sdpa (variant_cases, sink_chunk_leftpad_cases)."""
    words = []
    wanted = [name for name in variants if variant_allowed(name)]
    if "window" in wanted:
        window = _corner_window(op, inputs) if hint("index") is not None else None
        if window is None:
            window = (draw(_window_side(max_keys), label="window left"),
                      draw(_window_side(max_keys), label="window right"))
        inputs["window"] = window
        words.append(f"window={window}")
    scores = None
    if "softcap" in wanted or "learnable_sink" in wanted:
        scores = _sequence_scores(op, inputs, hq)
    if "softcap" in wanted:
        inputs["softcap"] = _softcap(draw, float(np.abs(scores[np.isfinite(scores)]).max(initial=0.0)), words)
    if "alibi_slopes" in wanted:
        inputs["alibi_slopes"] = _alibi_slopes(draw, b, hq, "per-sequence", words)
    if "learnable_sink" in wanted:
        form = draw(st.sampled_from(SINK_FORMS if hint("index") is None else SINK_FORMS_THAT_MATTER),
                    label="sink logits")
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="sink seed"))
        inputs["learnable_sink"] = _sink_logits(form, rng, _sequence_scores(op, inputs, hq))
        words.append(f"sink={form}")
    return words


# The window of a non-causal packed or paged corner whose queries pass every key (_corner_window): the left side
# bounded, the right unbounded.
SEQUENCE_CORNER_WINDOW = (1, None)


def _corner_window(op: str, inputs: dict) -> tuple | None:
    """SEQUENCE_CORNER_WINDOW at a non-causal corner whose pattern has a sequence with two more queries than any
    sequence has keys (the block table's keys, paged), else None (drawn). Bottom-right, that sequence's first rows sit
    before its keys: FlashAttention's varlen and kvcache paths give a bounded left side with an unbounded right the
    right edge seqlen_k (the batch's longest, or the table's pages times their size), which removes keys from those
    rows (flash-attention issue 895; a held-out kernel doing so passed 4 of 9 runs under random windows)."""
    if inputs.get("is_causal"):
        return None  # the band bounds the right
    sequences = oracle.sequence_cases(op, inputs)
    reach = (max(one["k"].shape[2] for one in sequences) if op == "sdpa_varlen"
             else inputs["block_table"].shape[1] * inputs["k_cache"].shape[1])
    return SEQUENCE_CORNER_WINDOW if any(one["q"].shape[2] >= reach + 2 for one in sequences) else None


def _sequence_shapes_inside(draw, op: str, sigmas, variants, **facts):
    """Filter a packed or paged draw the region refuses on its shape facts before any value is drawn; then the score
    magnitude and the values' seed: (magnitude name, seed, generator)."""
    _keep_inside(draw, {"op": op, "mask_kind": "none", "variants": tuple(n for n in variants if variant_allowed(n)),
                        **facts})
    magnitudes = st.sampled_from(sigmas)
    sigma_name = hint("magnitude") if admits(magnitudes, hint("magnitude")) else draw(magnitudes,
                                                                                      label="score magnitude")
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    return sigma_name, seed, np.random.default_rng(seed)


def _finish_sequence_case(draw, op: str, inputs: dict, variants, is_causal: bool, scale, hq: int,
                          max_keys: int) -> list[str]:
    """The options and per-sequence variants of a packed or paged case, then the region's last word on it; returns
    the label's words of the variants."""
    if is_causal:
        inputs["is_causal"] = True
    if scale is not None:
        inputs["scale"] = float(scale)
    sequences = len(inputs["cu_seqlens_q"]) - 1 if op == "sdpa_varlen" else inputs["q"].shape[0]
    words = _sequence_variants(draw, op, inputs, variants, sequences, hq, max_keys)
    _keep_inside(draw, shape_facts(op, inputs))
    return words


def _sequence_scores(op: str, inputs: dict, hq: int) -> np.ndarray:
    """(1, Hq, rows, keys): every sequence's scores (bottom-right), -inf where a key is removed or padding; what the
    softcap and the sink logits are drawn against."""
    rows = []
    for one in oracle.sequence_cases(op, inputs):
        if one["q"].shape[2] == 0:
            continue
        s = oracle.scores(one["q"], one["k"], None, one["is_causal"], one["scale"],
                          **{n: one[n] for n in ("window", "softcap", "alibi_slopes", "query_offset", "key_lengths")
                             if n in one})
        rows.append(np.broadcast_to(s, (1, hq) + s.shape[2:]))
    width = max(r.shape[-1] for r in rows)
    return np.concatenate([np.pad(r, ((0, 0), (0, 0), (0, 0), (0, width - r.shape[-1])), constant_values=-np.inf)
                           for r in rows], axis=2)


@st.composite
def varlen_cases(draw, *, clauses=("varlen.definition",), causal=st.booleans(), scale=SCALES, variants=(),
                 seqused=st.booleans(), unequal: bool = False, sigmas=tuple(SCORE_SIGMAS)) -> Case:
    """An sdpa_varlen case: B sequences packed along the token axis (SEQUENCE_PATTERNS at a covering corner).

    ``variants``: names of SEQUENCE_VARIANT_NAMES each drawn where the implementation runs it; ``seqused``: whether
    to pass seqused_k (then each sequence gets 0 to 2 unused key rows of garbage); ``unequal``: at least one
    sequence with Lq_b != Lk_b, both > 0 (where the alignments differ)."""
    region = active_region()
    hkv, hq = _sequence_heads(draw, region)
    dk, dv = _sequence_dims(draw, region)
    lengths_ok = region.lengths.members(range(1, MAX_SEQUENCE_LEN + 1))
    index = hint("index")
    if index is not None:
        pairs = [tuple(p) for p in SEQUENCE_PATTERNS[index % len(SEQUENCE_PATTERNS)]]
    else:
        count = draw(st.integers(1, MAX_SEQUENCES), label="sequences")
        pairs = [(draw(_sequence_lengths(MAX_SEQUENCE_LEN), label="Lq_b"),
                  draw(_sequence_lengths(MAX_SEQUENCE_LEN), label="Lk_b")) for _ in range(count)]
        if draw(st.integers(0, 3), label="a sequence past a tile") == 0:
            long = draw(st.sampled_from(SEQUENCE_TILE_LENGTHS), label="long sequence")
            at = draw(st.integers(0, count - 1), label="which sequence")
            pairs[at] = (long, pairs[at][1]) if draw(st.booleans(), label="queries or keys") else (pairs[at][0], long)
    if lengths_ok != list(range(1, MAX_SEQUENCE_LEN + 1)):  # a region without the small lengths: its own
        members = region.lengths.members(KERNEL_SMALL_LENGTHS) or [region.lengths.min]
        pairs = [tuple(0 if n == 0 else members[min(n, len(members)) - 1] for n in pair) for pair in pairs]
    if unequal and not any(lq != lk and lq and lk for lq, lk in pairs):
        lq, lk = pairs[0]
        pairs[0] = (max(lq, 1), max(lq, 1) + 2)
    if not any(lq for lq, _ in pairs):
        pairs[0] = (max(1, min(lengths_ok or [1])), pairs[0][1])
    if not any(lk for _, lk in pairs):
        pairs[-1] = (pairs[-1][0], max(1, min(lengths_ok or [1])))
    b = len(pairs)
    is_causal, chosen_scale = _sequence_options(draw, causal, scale)
    keywords = _ACTIVE[-1].keywords
    if _equal_lengths(region, is_causal):
        # Lq_b == Lk_b for every sequence, as a kernel with one cu_seqlens for queries and keys runs them (packed
        # self-attention: fla's parallel_attn); the declaration is about each sequence, not only the longest.
        if unequal:
            _outside_region(region.why_outside({"is_causal": is_causal, "equal_sequences": False}, ask_supports=False))
        pairs = [(lq, lq) for lq, _ in pairs]
    use_seqused = (keywords is None or "seqused_k" in keywords) and draw(seqused, label="seqused_k")
    slack = [draw(st.integers(0, 2), label="unused keys") if use_seqused else 0 for _ in range(b)]
    lq_b, lk_b = [lq for lq, _ in pairs], [lk for _, lk in pairs]
    sigma_name, seed, rng = _sequence_shapes_inside(draw, "sdpa_varlen", sigmas, variants, B=b, Hq=hq, Hkv=hkv,
                                                    Lq=max(lq_b), Lk=max(lk_b), Dk=dk, Dv=dv, is_causal=is_causal,
                                                    scale=chosen_scale)
    starts_q = np.concatenate([[0], np.cumsum(lq_b)]).astype(np.int32)
    allocated = [lk + extra for lk, extra in zip(lk_b, slack)]
    starts_k = np.concatenate([[0], np.cumsum(allocated)]).astype(np.int32)
    total_k = int(starts_k[-1])
    k = _sequence_values(draw, rng, (total_k, hkv, dk), sigma_name, dk)
    v = rng.standard_normal((total_k, hkv, dv))
    for start, used, extra in zip(starts_k[:-1], lk_b, slack):  # the unused keys: garbage
        k[start + used:start + used + extra] = rng.standard_normal((extra, hkv, dk)) * GARBAGE_K_SIGMA
        v[start + used:start + used + extra] = rng.standard_normal((extra, hkv, dv)) * GARBAGE_V_SIGMA
    inputs = {"q": _sequence_values(draw, rng, (int(starts_q[-1]), hq, dk), sigma_name, dk), "k": k, "v": v,
              "cu_seqlens_q": starts_q, "cu_seqlens_k": starts_k, "max_seqlen_q": int(max(lq_b)),
              "max_seqlen_k": int(max(allocated))}
    if use_seqused:
        inputs["seqused_k"] = np.asarray(lk_b, dtype=np.int32)
    words = _finish_sequence_case(draw, "sdpa_varlen", inputs, variants, is_causal, chosen_scale, hq, max(lk_b))
    label = (f"B{b} Hq{hq}/Hkv{hkv} Dk{dk} Dv{dv} (Lq, Lk)={pairs}"
             f"{f' seqused_k={lk_b} unused={slack}' if use_seqused else ''}{' causal' if is_causal else ''}"
             f" scale={chosen_scale} scores~{sigma_name} {' '.join(words)} seed={seed}").replace("  ", " ")
    return Case("sdpa_varlen", inputs, tuple(clauses), label)


def _used_lengths(block: int, limit: int):
    """Cache lengths at and around page boundaries (a multiple of the block size, one short, one past), 0, or any."""
    boundaries = sorted({n for m in range(0, limit + 1, block) for n in (m - 1, m, m + 1) if 0 <= n <= limit})
    return st.sampled_from(boundaries) | st.integers(0, limit)


@st.composite
def paged_cases(draw, *, clauses=("paged.definition",), causal=st.booleans(), scale=SCALES, variants=(),
                shared=st.booleans(), sigmas=tuple(SCORE_SIGMAS)) -> Case:
    """An sdpa_paged case (PAGED_PATTERNS at a covering corner): q (B, Hq, Lq, Dk), a pool of pages in shuffled
    order, each sequence's table naming its pages (``shared``: one page shared by two sequences), the entries past
    its last used page and every unused page and slot holding garbage."""
    region = active_region()
    hkv, hq = _sequence_heads(draw, region)
    dk, dv = _sequence_dims(draw, region)
    index = hint("index")
    if index is not None:
        block, used, lq, share = PAGED_PATTERNS[index % len(PAGED_PATTERNS)]
        used = list(used)
    else:
        block = draw(st.integers(1, 5), label="block size")
        count = draw(st.integers(1, MAX_SEQUENCES - 1), label="sequences")
        used = [draw(_used_lengths(block, 3 * MAX_SEQUENCE_LEN // 2), label="seqused_k") for _ in range(count)]
        lq = draw(st.integers(1, MAX_SEQUENCE_LEN), label="Lq")
        share = draw(shared, label="a shared page")
    lq = (region.lengths.members(range(lq, MAX_SEQUENCE_LEN + 1)) or region.lengths.members(KERNEL_SMALL_LENGTHS)
          or [region.lengths.min])[0]
    if not any(used):
        used[0] = block + 1
    b = len(used)
    is_causal, chosen_scale = _sequence_options(draw, causal, scale)
    sigma_name, seed, rng = _sequence_shapes_inside(draw, "sdpa_paged", sigmas, variants, B=b, Hq=hq, Hkv=hkv, Lq=lq,
                                                    Lk=max(used), Dk=dk, Dv=dv, is_causal=is_causal,
                                                    scale=chosen_scale)
    pages = [-(-n // block) for n in used]
    spare = int(rng.integers(1, 4))  # pages no sequence uses
    num_blocks = sum(pages) + spare
    pool = rng.permutation(num_blocks)  # the pool in shuffled order
    table = np.zeros((b, max(pages) + int(rng.integers(0, 2))), dtype=np.int32)
    taken = 0
    for row, n in enumerate(pages):
        table[row, :n] = pool[taken:taken + n]
        taken += n
    sharing = ""
    holders = [row for row, n in enumerate(pages) if n]
    if share and len(holders) >= 2:  # a page of one sequence serves another too (its own page freed)
        first, second = holders[0], holders[1]
        at_first, at_second = int(rng.integers(0, pages[first])), int(rng.integers(0, pages[second]))
        table[second, at_second] = table[first, at_first]
        sharing = f" page {int(table[first, at_first])} shared (seq {first} block {at_first}, seq {second} block {at_second})"
    for row, n in enumerate(pages):  # entries past the used ones: any page of the pool
        table[row, n:] = rng.integers(0, num_blocks, size=table.shape[1] - n)
    k_cache = rng.standard_normal((num_blocks, block, hkv, dk)) * GARBAGE_K_SIGMA
    v_cache = rng.standard_normal((num_blocks, block, hkv, dv)) * GARBAGE_V_SIGMA
    for row, n in enumerate(used):  # the used slots: real keys (a shared page keeps the first sequence's)
        for j in range(n):
            page, slot = table[row, j // block], j % block
            if row == 0 or not any(table[r, i // block] == page and i % block == slot
                                   for r in range(row) for i in range(used[r])):
                k_cache[page, slot] = _sequence_values(draw, rng, (hkv, dk), sigma_name, dk)
                v_cache[page, slot] = rng.standard_normal((hkv, dv))
    inputs = {"q": _sequence_values(draw, rng, (b, hq, lq, dk), sigma_name, dk), "k_cache": k_cache,
              "v_cache": v_cache, "block_table": table, "seqused_k": np.asarray(used, dtype=np.int32)}
    words = _finish_sequence_case(draw, "sdpa_paged", inputs, variants, is_causal, chosen_scale, hq, max(used))
    label = (f"B{b} Hq{hq}/Hkv{hkv} Dk{dk} Dv{dv} Lq{lq} block_size={block} seqused_k={used} "
             f"pages={num_blocks}{sharing}{' causal' if is_causal else ''} scale={chosen_scale} scores~{sigma_name} "
             f"{' '.join(words)} seed={seed}").replace("  ", " ").rstrip()
    return Case("sdpa_paged", inputs, tuple(clauses), label)


# ------------------------------------------------------------------ multi_head_attention with variants
# mha.variants: sdpa's variant keywords applied to each head's attention after the projections (Hq = Hkv =
# num_heads). A case of mha_cases with some of them, drawn at sdpa's edges (_draw_variant_keywords,
# _draw_sink_chunk_leftpad) on the per-head q and k its projections give, so that softcaps and sink logits are placed
# against those heads' own scores.
MHA_VARIANTS = VARIANTS + SINK_FEATURES


def _runs_variant(name: str) -> bool:
    """variant_allowed for a name of VARIANTS or SINK_FEATURES ("lengths" passes key_lengths, query_lengths too)."""
    return variant_allowed("key_lengths" if name == "lengths" else name)


@st.composite
def mha_variant_cases(draw, *, variants=MHA_VARIANTS, required=None, clauses=("mha.variants",),
                      mask_kinds=("none", "key-padding", "float"), causal=st.booleans(), min_heads: int = 1) -> Case:
    """A multi_head_attention case using some of ``variants`` (names of VARIANTS and SINK_FEATURES): each the
    implementation runs (its multi_head_attention signature and its region) drawn with probability 1/2, at least one
    of ``required`` (default: of ``variants``). Rows may be left without keys, as in variant_cases."""
    runnable = [name for name in variants if _runs_variant(name)]
    needed = [name for name in runnable if required is None or name in required]
    if not needed:
        _outside_region(f"multi_head_attention takes none of the variant keywords {', '.join(required or variants)}")
    chosen = [name for name in runnable if draw(st.booleans(), label=f"uses {name}")]
    if not set(chosen) & set(needed):
        chosen.append(draw(st.sampled_from(needed), label="the variant"))
    case = draw(mha_cases(clauses=clauses, mask_kinds=mask_kinds, causal=causal, min_heads=min_heads,
                          allow_empty_rows=True), label="base case")
    inputs = dict(case.inputs)
    trace: dict = {}
    oracle.multi_head_attention(inputs["query"], inputs["key"], inputs["value"], inputs["params"],
                                inputs["num_heads"], trace=trace)
    heads = {"q": trace["q_heads"], "k": trace["k_heads"], "mask": inputs.get("mask"),
             "is_causal": inputs.get("is_causal", False)}
    words = _draw_variant_keywords(draw, heads, [n for n in VARIANTS if n in chosen])
    words += _draw_sink_chunk_leftpad(draw, heads, [n for n in SINK_FEATURES if n in chosen])
    inputs.update(oracle.variant_options(heads))
    _keep_inside(draw, shape_facts("multi_head_attention", inputs))
    return Case("multi_head_attention", inputs, case.clauses, f"{case.label} {' '.join(words)}",
                mask_kind=case.mask_kind)


# ------------------------------------------------------------------ FP8 attention (issue 25)
# 8-bit q, k, v with per-(batch, kv head) descale factors (README "The contract", FP8; spec/clauses.yaml
# sdpa.fp8-descale), on a case of variant_cases: its real values x are quantized the way FP8 inference stores
# them, stored = fp8(x / descale), and the case holds the stored values (exact in the 8-bit dtype under test) and
# the float32 factors. Each tensor draws how its factors are set: "calibrated" (descale = max |x| / the format's
# largest value per (batch, kv head), with the heads' magnitudes spread over a decade so that the factors
# differ by up to 10x: what FlashAttention 3's users and vLLM's calibration do), "one" (descale 1: the stored
# values are the real ones), "large" (descales 2^3 .. 2^8: small stored values, the format's subnormals and zeros
# among them), "small" (2^-8 .. 2^-3: stored values near the top of the format) and "per-tensor" (one factor for
# every (batch, kv head): vLLM's per-tensor scales expanded to (B, Hkv)). q's factors are per kv head: one for the
# query heads of a group.
DESCALE_FORMS = ("calibrated", "one", "large", "small", "per-tensor")
FP8_SCALES = st.none() | st.sampled_from([1.0, 0.125, 0.5])


def _eight_bit_dtype() -> str:
    """The 8-bit dtype the active drawing is for (float8_e4m3fn outside a test of one)."""
    from attention_conformance.implementations._arrays import is_eight_bit

    dtype = _ACTIVE[-1].facts.get("dtype")
    return dtype if dtype is not None and is_eight_bit(dtype) else "float8_e4m3fn"


def quantized(x: np.ndarray, kv_heads: int, form: str, dtype: str, rng: np.random.Generator):
    """(stored values, descale factors (B, Hkv) float32) of the real values x (B, H, L, D) in the 8-bit ``dtype``:
    stored = x / descale rounded to the format (clipped to its range), every value of a (batch, kv head) sharing a
    factor (the query heads of a group share their kv head's)."""
    from attention_conformance.implementations._arrays import numpy_dtype

    import ml_dtypes

    fmt = numpy_dtype(dtype)
    largest = float(ml_dtypes.finfo(fmt).max)
    b, h = x.shape[:2]
    grouped = x.reshape(b, kv_heads, -1)  # the heads of a group together: (B, Hkv, G * L * D)
    if form in ("calibrated", "per-tensor"):
        # Heads of different magnitudes, a decade apart at most: scores stay within 10x of the magnitude class drawn
        # (16-bit scores near 1e4 at most, inside float16's range for an FP8_OUTPUT_DTYPE float16 path).
        spread = 10.0 ** rng.uniform(-0.5, 0.5, size=(b, kv_heads, 1))
        grouped = grouped * spread
        top = np.max(np.abs(grouped), axis=-1)
        top = np.max(top, keepdims=True) * np.ones_like(top) if form == "per-tensor" else top
        descale = np.where(top > 0, top / largest, 1.0)
    elif form == "one":
        descale = np.ones((b, kv_heads))
    else:
        exponents = rng.uniform(3.0, 8.0, size=(b, kv_heads))
        descale = 2.0 ** (exponents if form == "large" else -exponents)
    descale = descale.astype(np.float32).astype(np.float64)
    stored = np.clip(grouped / descale[..., None], -largest, largest).astype(fmt).astype(np.float64)
    return stored.reshape(x.shape), descale


@st.composite
def fp8_cases(draw, *, variants=(), clauses=("sdpa.fp8-descale",), mask_kinds=("none", "key-padding", "bool-full"),
              causal=st.booleans(), scale=FP8_SCALES, forms=st.sampled_from(DESCALE_FORMS), **base) -> Case:
    """An sdpa case of 8-bit q, k, v (the 8-bit dtype under test) with descale factors, on a case of variant_cases
    using ``variants`` (VARIANTS; none by default). ``forms``: how each tensor's factors are set (DESCALE_FORMS).
    Float masks are not drawn (an 8-bit case's inputs are q, k, v and their factors; FlashAttention 3 takes none)."""
    dtype = _eight_bit_dtype()
    case = draw(variant_cases(variants=variants, clauses=clauses, mask_kinds=mask_kinds, causal=causal,
                              scale=scale, outermost=False, **base), label="base case")
    inputs = dict(case.inputs)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="descales seed"))
    kv_heads = inputs["k"].shape[1]
    words = []
    for name in ("q", "k", "v"):
        form = draw(forms, label=f"{name} descales")
        inputs[name], inputs[f"{name}_descale"] = quantized(inputs[name], kv_heads, form, dtype, rng)
        words.append(f"{name}:{form}")
    _keep_inside(draw, shape_facts("sdpa", inputs))
    return Case("sdpa", inputs, case.clauses, f"{case.label} {dtype} descales {' '.join(words)}",
                mask_kind=case.mask_kind)

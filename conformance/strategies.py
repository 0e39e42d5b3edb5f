"""Every Hypothesis strategy of the suite, in one place.

Draws are labelled and sizes capped (MAX_* below) so each example stays cheap and a
failure shrinks to a small, readable case. Array values come from a drawn seed
(NumPy's generator): shrinking then works on shapes, masks and flags, which is
where attention bugs live, and a repro prints the values literally.
"""
from __future__ import annotations

import contextlib
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

    def leaves(self, region: Region) -> str | None:
        """Why no derived case can lie inside ``region`` (its declared keys; supports() is asked per draw)."""
        reason = region.why_outside({"op": "sdpa", **self.sets}, ask_supports=False)
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
        keys = [n for n in candidates if lq * n <= budget_per_pair] or candidates[:1]
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
    }[kind]


def _build_mask(rng, kind, shape, lq, lk, is_causal, allow_empty_rows):
    """A mask of the given kind; unless empty rows are allowed, every row keeps one attendable key."""
    keep = rng.random(shape) < 0.6
    if not allow_empty_rows:
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
    heads and groups where the region allows them and draws its head dims from the region.
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
    wanted = hint("is_causal")
    is_causal = wanted if admits(causal, wanted) and (region.causal or not wanted) else draw(causal, label="is_causal")
    if is_causal and not region.causal:
        _outside_region("is_causal=True (declared causal: False)")
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
        head_dims = region.head_dims.members(KERNEL_HEAD_DIMS) or [region.head_dims.min]
        dims = st.sampled_from(head_dims)
    else:
        lengths = st.integers(1, MAX_LEN) if lengths is None else lengths
        if not corner_lengths:
            lq = draw(lengths, label="Lq")
            lk = lq if same_lengths else draw(lengths, label="Lk")
        dims = _inside(st.integers(1, MAX_DIM) if dims is None else dims, region.head_dims)
    lq, lk = _lengths_in_order(lq, lk, region, is_causal)
    dk = hint("Dk") if hint("Dk") is not None and admits(dims, hint("Dk")) else draw(dims, label="Dk")
    # Half the cases keep Dv == Dk, which many kernels require.
    wanted_dv = hint("Dv")
    if same_dims or region.same_value_dim or (wanted_dv == dk if wanted_dv is not None
                                               else draw(st.booleans(), label="Dv == Dk")):
        dv = dk
    else:
        dv = wanted_dv if wanted_dv is not None and admits(dims, wanted_dv) else draw(dims, label="Dv")
    if hint("mask_kind") in kinds:
        kind = hint("mask_kind")
    elif hint("mask") is not None:
        kind = kinds[hint("mask") % len(kinds)]
    else:
        kind = draw(st.sampled_from(kinds), label="mask")
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
    if draw(st.integers(0, 2), label="long axis") == 0:
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
SOFTMAX_EDGE_LENGTHS = tuple(sorted({w + d for w in (8, 16, 32, 64, 128, 256) for d in (-1, 0, 1)}))


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
    b = draw(st.integers(1, MAX_BATCH), label="B")
    h = draw(st.integers(min_heads, 3), label="H")
    length_choices = region.lengths.members(range(max(min_len, 1), MAX_LEN + 1)) or region.lengths.members(
        KERNEL_SMALL_LENGTHS + KERNEL_EDGE_LENGTHS)[:1] or [region.lengths.min]
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
    is_causal = draw(causal, label="is_causal")
    if is_causal and not region.causal:
        _outside_region("is_causal=True (declared causal: False)")
    lq, lk = _lengths_in_order(lq, lk, region, is_causal)
    kind = draw(st.sampled_from(kinds), label="mask")
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


@st.composite
def variant_cases(draw, *, variants=VARIANTS, clauses=("sdpa.variant-order",), mask_kinds=("none",),
                  causal=st.booleans(), gqa: bool = True, scale=st.none(), same_lengths: bool = False,
                  outermost: bool = True, **base) -> Case:
    """An sdpa case using the variant keywords named in ``variants`` (each always used) on a case of sdpa_cases.

    ``variants``: names of VARIANTS; "lengths" draws key_lengths and, half the time, query_lengths (where the
    implementation runs them: its declared variants and its signature).
    ``base``: further keywords of sdpa_cases. ``outermost``: False where another strategy adds keywords to the
    case (sink_chunk_leftpad_cases), which then asks the region.
    """
    case = draw(sdpa_cases(mask_kinds=mask_kinds, causal=causal, gqa=gqa, scale=scale, same_lengths=same_lengths,
                           clauses=clauses, allow_empty_rows=True, outermost=False, **base), label="base case")
    inputs = dict(case.inputs)
    q, k = inputs["q"], inputs["k"]
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    words = []
    if "query_offset" in variants:
        offset = draw(_offsets(lq, lk), label="query_offset")
        inputs["query_offset"] = offset
        words.append(f"offset={offset}")
    if "window" in variants:
        window = (draw(_window_side(lk), label="window left"), draw(_window_side(lk), label="window right"))
        inputs["window"] = window
        words.append(f"window={window}")
    if "softcap" in variants:
        scale_value = inputs.get("scale", q.shape[-1] ** -0.5)
        top = float(np.max(np.abs(q @ np.swapaxes(oracle.repeat_kv_heads(k, hq), -1, -2) * scale_value), initial=0.0))
        ratio = draw(st.sampled_from(SOFTCAP_RATIOS), label="softcap / max |score|")
        # Kept within 1e-2 .. 6e4: a softcap a 16-bit implementation rounds to its dtype stays normal and finite.
        inputs["softcap"] = float(np.clip(max(top, 1e-3) * ratio, 1e-2, 6e4))
        words.append(f"softcap={inputs['softcap']:.3g} ({ratio}x max score)")
    if "alibi_slopes" in variants:
        form = draw(st.sampled_from(["geometric", "random", "per-example"]), label="ALiBi slopes")
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="slopes seed"))
        if form == "geometric":  # Press et al.: 2^(-8h/H), h = 1..H
            slopes = 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)
        else:  # mixed magnitudes, 1e-3 .. 1
            slopes = 10.0 ** rng.uniform(-3, 0, size=(b, hq) if form == "per-example" else (hq,))
        inputs["alibi_slopes"] = slopes
        words.append(f"alibi={form}")
    if "lengths" in variants:
        inputs["key_lengths"] = np.array([draw(_lengths(lk), label="key length") for _ in range(b)], dtype=np.int32)
        words.append(f"key_lengths={inputs['key_lengths'].tolist()}")
        if variant_allowed("query_lengths") and draw(st.booleans(), label="query lengths"):
            inputs["query_lengths"] = np.array([draw(_lengths(lq), label="query length") for _ in range(b)],
                                               dtype=np.int32)
            words.append(f"query_lengths={inputs['query_lengths'].tolist()}")
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


@st.composite
def sink_chunk_leftpad_cases(draw, *, features=SINK_FEATURES, variants=(), clauses=("sdpa.learnable-sink",),
                             mask_kinds=("none",), causal=st.booleans(), **base) -> Case:
    """An sdpa case using the issue-25 keywords named in ``features`` (each always used; SINK_FEATURES) on a case
    of variant_cases with the older variant keywords ``variants`` (VARIANTS). With sink_token_length, a window
    whose left edge is unbounded gets a bounded one (the sink tokens' only effect). ``base``: further keywords of
    variant_cases / sdpa_cases."""
    case = draw(variant_cases(variants=variants, clauses=clauses, mask_kinds=mask_kinds, causal=causal,
                              outermost=False, **base), label="variant case")
    inputs = dict(case.inputs)
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
        form = draw(st.sampled_from(SINK_FORMS), label="sink logits")
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="sink seed"))
        scores = oracle.scores(q, k, inputs.get("mask"), inputs.get("is_causal", False), inputs.get("scale"),
                               **oracle.variant_options(inputs))
        inputs["learnable_sink"] = _sink_logits(form, rng, np.broadcast_to(scores, (b, hq, lq, lk)))
        words.append(f"sink={form}")
    _keep_inside(draw, shape_facts("sdpa", inputs))  # with this case's own keywords among its variants
    return Case("sdpa", inputs, case.clauses, f"{case.label} {' '.join(words)}", mask_kind=case.mask_kind)


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

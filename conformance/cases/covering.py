"""The deterministic covering set each property runs before its random draws.

A kernel's bugs live at structural corners: causal with Lq <, = and > Lk; lengths one
short of, at and one past a block; one kv head, 1 < Hkv < Hq, Hkv = Hq; the smallest and
largest head dim; a zero or negative scale; each mask kind. A few dozen random draws at
an expensive per-call cost miss them (a Pallas-shaped kernel was judged on 78 random
cases and passed, with NaN rows for causal Lq > Lk inside its own region). So every
property first runs the corners below, made concrete inside the judged implementation's
declared region (SUPPORTS), then draws at random as before.

How a corner becomes a case: ``CORNERS`` names each corner abstractly (a length relation,
a kv-head layout, "the largest head dim"); ``hints_for`` turns it into concrete numbers for
a region; the property's own strategy is then *built*, not drawn, by ``DeterministicDraw``:
each labelled draw of conformance/cases/ takes the hinted value when the property's
strategy admits it (``admits``) and the strategy's first value otherwise. A property that
holds a feature fixed (``causal=st.just(False)``, ``gqa=False``) therefore keeps it fixed,
and its corners are those of the features it varies; two corners that build the same case
are run once.

Random draws never see hints: with no corner active the strategies draw exactly as before.
"""
from __future__ import annotations

import contextlib
import contextvars
import random

from hypothesis.strategies._internal.collections import ListStrategy
from hypothesis.strategies._internal.core import CompositeStrategy, DataStrategy
from hypothesis.strategies._internal.lazy import LazyStrategy
from hypothesis.strategies._internal.misc import BooleansStrategy
from hypothesis.strategies._internal.numbers import IntegersStrategy
from hypothesis.strategies._internal.strategies import FilteredStrategy, OneOfStrategy, SampledFromStrategy

from attention_conformance.implementations.region import Region, causal_lengths_ok, scale_ok

# The structural corners, most telling first (a property that admits fewer of them runs fewer cases).
# lengths: "q>k" (more queries than keys: a causal key loop that runs past the last key block), "q<k", "q=k" past a
# block with a long tail (127 at 64; past 128 rows: one past), "decode" (Lq 1 against a long cache), "spec-decode"
# (a few queries against it, speculative decoding: a split-KV kernel that took the causal limit of every row from the
# last query was exact at Lq 1 and passed a default run, its causal decode corner then Lq 1), "edge-1"/"edge"
# (one short of, at a block). kv: "grouped" (1 < Hkv < Hq), "one" (Hkv = 1, Hq > 1), "full" (Hkv = Hq), "single" (one
# head). dk: the region's smallest or largest head dim. scale: None (the default 1/sqrt(Dk)), or an explicit value.
# mask_kind: the corner's mask where the property draws that kind, else ``mask``: the i-th kind the property draws. One
# kind per corner across properties: a compiling implementation then meets the same input signatures in every property
# and compiles each once (jax_numpy's forward properties: 374 -> 204 compiles). kernel: kernel-shaped (around a block of
# 64) also for an implementation that takes the small shapes, whose other corners are small. long_cache: the decode
# property's case of this corner has a cache past 4096 keys (strategies.DECODE_CACHE_LENGTHS); the second such corner,
# with large scores, is where a split-KV combine that weights the splits by exp(lse) without subtracting the largest
# overflows (an independently written kernel doing so failed 1 or 2 of about 1950 cases a run, in 16 bits only, before
# it). "long-q": a long query (past LONG_QUERY_ROWS - 1 rows) against few keys, cheap (few scores a row): a kernel that
# ran its queries in chunks of 256 and built each chunk's causal band from chunk-local rows passed two default runs.
# causal_only: a property that holds is_causal off skips the corner (strategies.sdpa_cases). window: the window a
# variant case takes at the corner ("past": a side beyond every key), else drawn. The third corner, every brief set's
# non-causal one, has (past, 0): the right edge alone removes keys, the left never does (a kernel that ran full
# attention for a left side past every query position without is_causal, libflash_attn PR 11, was caught only by one
# random decode case per run before). The second corner is a compiling implementation's first corner of a brief set
# (properties.BRIEF_CORNERS_COMPILED): grouped (Hkv 2, 2 query heads each), since a GQA mapping or a backward's sum over
# a group that is wrong only with Hkv > 1 and G > 1 (an independently written JAX custom_vjp summing dk, dv in tile
# order) passed every run while it was Hkv 1; its scale -0.35 (one of strategies.SCALES, so that sdpa_cases takes it) is
# no +-1/sqrt(Dk) at its head dim 1 (a backward taking softcap's derivative at the default scale was exact at -1.0,
# tanh^2 being even).
CORNERS: tuple[dict, ...] = (
    dict(is_causal=True, lengths="q>k", kv="grouped", dk="max", scale=None, kernel=True, mask_kind="none"),
    dict(is_causal=True, lengths="q<k", kv="grouped", dk="min", scale=-0.35, mask_kind="none", batch=2),
    dict(is_causal=False, lengths="q>k", kv="one", dk="min", scale=0.0, mask=1, mask_kind="bool-full", batch=2,
         window=("past", 0)),
    dict(is_causal=False, lengths="decode", kv="grouped", dk="max", scale=None, mask=2, mask_kind="key-padding",
         long_cache=True),
    dict(is_causal=True, lengths="q=k", kv="full", dk="max", scale=0.125, mask=1, mask_kind="bool-full"),
    dict(is_causal=False, lengths="q<k", kv="grouped", dk="min", scale=-1.0, mask=3, dv="other", mask_kind="float"),
    dict(is_causal=False, lengths="edge-1", kv="full", dk="max", scale=None, magnitude="large", kernel=True, mask_kind="none"),
    dict(is_causal=True, lengths="edge", kv="one", dk="min", scale=None, mask=2, mask_kind="key-padding"),
    dict(is_causal=False, lengths="q=k", kv="grouped", dk="max", scale=0.0, mask=4, mask_kind="float"),
    dict(is_causal=True, lengths="spec-decode", kv="grouped", dk="min", scale=None, mask=5, magnitude="large",
         mask_kind="bool-query-keys", long_cache=True, kernel=True),
    dict(is_causal=False, lengths="q>k", kv="full", dk="min", scale=-1.0, mask=6, dv="other", mask_kind="bool-3d-per-head"),
    dict(is_causal=True, lengths="q>k", kv="one", dk="max", scale=None, mask=7, mask_kind="bool-2d"),
    dict(is_causal=True, lengths="long-q", kv="single", dk="min", scale=None, kernel=True, mask_kind="none",
         causal_only=True),
    # Padded queries past a key tile, only where the property draws them (mask_only: the fully masked rows): a kernel
    # that sliced its mask per key tile lost a mask whose key axis is 1 after the first tile, and passed a default run.
    dict(is_causal=False, lengths="q<k", kv="one", dk="min", scale=None, mask_kind="query-padding", kernel=True,
         mask_only=True),
    # A compiling implementation's last brief corner (properties.BRIEF_CORNERS_COMPILED): what the first two leave out.
    dict(is_causal=False, lengths="q>k", kv="grouped", dk="max", scale=None, mask=1, mask_kind="float", batch=2),
)


# A compiling implementation's one random example of a brief property is Hypothesis's simplest (B 1, one head, one
# key: no softmax Jacobian, no mask), so its brief set is three corners. Held-out kernels that passed every run under
# one causal corner of batch 1 with scale -1: a window's right edge dropped in the backward, softcap's derivative
# only at the default scale, ALiBi's slopes of the first batch row, dsink averaged over the batch, dmask summed over
# it, a backward that took scale 0 for the default, a bool mask (B, 1, 1, Lk) tiled over the heads in batch-major
# order, an MHA float mask added before the scale.
COMPILED_BRIEF_CORNER = len(CORNERS) - 1


# A corner case may hold up to this many scores (B * Hq * Lq * Lk): four times a random kernel-shaped
# case's budget, so that a region whose lengths are multiples of 128 still gets Lq > Lk with grouped heads.
COVERING_SCORE_BUDGET = 2**17


_HINTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("covering_hints", default=None)


def hint(name: str):
    """The active corner's value for ``name`` (None: no corner active, or it says nothing of ``name``)."""
    hints = _HINTS.get()
    return None if hints is None else hints.get(name)


def hinted(name: str) -> bool:
    """Whether the active corner sets ``name`` (its value may be None: the default scale, say)."""
    hints = _HINTS.get()
    return hints is not None and name in hints


@contextlib.contextmanager
def context_value(variable: contextvars.ContextVar, value):
    """``variable`` set to ``value`` while active."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)


def building(hints: dict):
    """Strategies built inside take these hints (conformance/cases/ reads them with ``hint``)."""
    return context_value(_HINTS, hints)


# ------------------------------------------------------------------ strategy introspection
def unwrap(strategy):
    while isinstance(strategy, LazyStrategy):
        strategy = strategy.wrapped_strategy
    return strategy


ENUMERABLE_RANGE = 4096  # integer ranges up to this wide are listed; wider ones are a (min, max) range


def strategy_values(strategy) -> list | None:
    """Every value ``strategy`` can produce, in its own order, when that is a short list; None otherwise."""
    s = unwrap(strategy)
    if isinstance(s, BooleansStrategy):
        return [False, True]
    if isinstance(s, SampledFromStrategy) and not s._transformations:  # just() is one too
        return list(s.elements)
    if isinstance(s, IntegersStrategy) and s.start is not None and s.end is not None \
            and s.end - s.start <= ENUMERABLE_RANGE:
        return list(range(s.start, s.end + 1))
    if isinstance(s, OneOfStrategy):
        values: list = []
        for branch in s.original_strategies:
            more = strategy_values(branch)
            if more is None:
                continue
            values.extend(v for v in more if v not in values)
        return values or None
    if isinstance(s, FilteredStrategy):
        inner = strategy_values(s.filtered_strategy)
        return None if inner is None else [v for v in inner if all(c(v) for c in s.flat_conditions)]
    return None


def admits(strategy, value) -> bool:
    """Whether ``strategy`` can produce ``value`` (False when that cannot be told)."""
    values = strategy_values(strategy)
    if values is not None:
        return any(type(v) is type(value) and v == value for v in values) or (
            value is None and None in values)
    s = unwrap(strategy)
    return isinstance(s, IntegersStrategy) and isinstance(value, int) and (
        (s.start is None or value >= s.start) and (s.end is None or value <= s.end))


# The draws of conformance/cases/ that set a case's structure: without a hint they take the strategy's
# first (simplest) value. Every other draw (values seeds, variant keywords, a permutation) is free.
STRUCTURE_LABELS = frozenset({"kernel-shaped", "B", "Hkv", "Hq/Hkv", "is_causal", "query mode", "Lq = Lk",
                              "Lq (decode)", "Lq", "Lk", "Dk", "Dv == Dk", "Dv", "mask", "score magnitude", "scale"})


class CannotBuild(Exception):
    """A corner the property's strategy cannot build (a filter rejects it, or a strategy has no first value)."""


class DeterministicDraw:
    """A ``draw`` for the suite's composite strategies that builds one case without Hypothesis.

    A labelled draw takes ``pick[label]`` when the strategy admits it; any other draw takes the
    strategy's first value (Hypothesis's simplest) when it sets structure (STRUCTURE_LABELS); the
    free draws come from a generator seeded by the corner's index, so corners differ in their values
    and variant keywords too.
    """

    def __init__(self, index: int, pick: dict | None = None):
        self.rng = random.Random(index)
        self.pick = pick or {}

    def __call__(self, strategy, label=None):
        s = unwrap(strategy)
        if isinstance(s, CompositeStrategy):
            return s.definition(self, *s.args, **s.kwargs)
        if isinstance(s, DataStrategy):
            return _DataStandIn(self)
        if isinstance(s, FilteredStrategy) and strategy_values(s) is None:
            value = self(s.filtered_strategy, label)
            if not all(condition(value) for condition in s.flat_conditions):
                raise CannotBuild(f"this corner's value of {label or 'a draw'} is filtered out")
            return value
        if label in self.pick and admits(s, self.pick[label]):
            return self.pick[label]
        values = strategy_values(s)
        free = label not in STRUCTURE_LABELS
        if values:
            return self.rng.choice(values) if free else values[0]
        if isinstance(s, ListStrategy) and s.max_size != float("inf"):
            size = self.rng.randint(s.min_size, s.max_size) if free else s.min_size
            return [self(s.element_strategy, None if free else label) for _ in range(size)]
        if isinstance(s, IntegersStrategy):
            low = s.start if s.start is not None else 0
            return self.rng.randint(low, s.end if s.end is not None else low + 2**16) if free else low
        raise CannotBuild(f"the covering set cannot build a value of {strategy!r} (label {label!r}); "
                          "a sampled_from or a bounded integers strategy it can")


class _DataStandIn:
    """What a test given ``st.data()`` draws from while its corners are built."""

    def __init__(self, draw: DeterministicDraw):
        self._draw = draw

    def draw(self, strategy, label=None):
        return self._draw(strategy, label)


# ------------------------------------------------------------------ corners made concrete
def _block(region: Region) -> int:
    """The region's block: its declared length multiple, else 64 (the key tile of flash kernels)."""
    return region.lengths.multiple if region.lengths.multiple > 1 else 64


# The query block of GPU attention kernels (FlashAttention-2 and Triton's tutorial tile queries by 128 rows): bugs of
# a kernel's second query block need a query past it.
QUERY_BLOCK_ROWS = 128


# The "long-q" corner's lengths: queries past memory-efficient attention's chunks of 1024 rows, against 17 keys.
LONG_QUERY_ROWS, LONG_QUERY_KEYS = 1025, 17


PAST_QUERY_BLOCK_MAX_DK = 64  # the largest head dim of those corners


def _length_pair(relation: str, region: Region, small: bool, past_query_block: bool = False) -> tuple[int, int]:
    """(Lq, Lk) for a length relation: small shapes (1..7), or around the region's block (``past_query_block``: the
    queries of "q>k", "q=k" and "q<k" past QUERY_BLOCK_ROWS as well)."""
    if small:
        return {"q>k": (7, 3), "q<k": (3, 7), "q=k": (5, 5), "decode": (1, 7), "spec-decode": (2, 7), "edge-1": (6, 6),
                "edge": (7, 7)}[relation]
    block = _block(region)
    reach = max(block, QUERY_BLOCK_ROWS) if past_query_block else block
    near = {n for m in (block, 2 * block, 3 * block) for n in (m - 1, m, m + 1)} | {1, 2, 4}
    if past_query_block:
        near |= {n for m in (reach, 2 * reach) for n in (m - 1, m, m + 1)}
    members = region.lengths.members(sorted(near)) or [region.lengths.min]
    up_to_block = [n for n in members if n <= reach] or members[:1]
    past_block = [n for n in members if n > reach] or members[-1:]
    if relation == "q>k":  # one query block more than the keys: a causal key loop must stop at the last key
        return past_block[0], up_to_block[-1]
    if relation == "q<k":
        if past_query_block and len(past_block) > 1:
            return past_block[0], past_block[min(len(past_block) - 1, 2)]
        # Queries a whole block, keys one past two blocks (64 and 129 at a block of 64): a kernel that decided its
        # keys were whole blocks from the query length (Triton's EVEN_N from Lq) attended the padding past the last
        # key; every other kernel pair had Lq off the block or Lk on it.
        return up_to_block[-1], past_block[min(len(past_block) - 1, 3)]
    if relation == "q=k":
        if past_query_block:
            return past_block[0], past_block[0]
        # Past one block with a tail of many rows and keys (127 at a block of 64), where the other relations' tails
        # are one long: a kernel whose masked tail path compared the tile-local key index with the row (the causal
        # band right of the diagonal kept in the last, partial key tile) was exact at 65 and passed a default run.
        tails = [n for n in past_block if n % block >= 2]
        return (tails or past_block)[0], (tails or past_block)[0]
    if relation == "decode":
        return members[0], members[-1]
    if relation == "spec-decode":
        return (region.lengths.members((4, 3, 2)) or members[:1])[0], members[-1]
    if relation == "long-q":
        lengths = region.lengths
        top = lengths.members((LONG_QUERY_ROWS, LONG_QUERY_ROWS - 1, 2 * LONG_QUERY_ROWS - 2)) or members[-1:]
        few = lengths.members((LONG_QUERY_KEYS, LONG_QUERY_KEYS - 1, 2 * LONG_QUERY_KEYS - 2, 64, 128)) or members[:1]
        return top[0], min(few[0], top[0])
    wanted = block - 1 if relation == "edge-1" else block
    n = min(members, key=lambda m: (abs(m - wanted), m))
    return n, n


def _kv_heads(kv: str, region: Region, small: bool) -> tuple[int, int]:
    """(Hkv, Hq / Hkv) for a kv layout inside the region's GQA declaration (small cases: groups up to 3)."""
    largest = 3 if small else 4
    largest = largest if region.max_group is None else max(1, min(largest, region.max_group))
    if kv == "single":
        return 1, 1
    if not region.gqa or largest == 1:
        return (2, 1) if kv == "full" else (1, 1)
    return {"grouped": (2, 2), "one": (1, largest), "full": (2, 1)}[kv]


def hints_for(corner: dict, index: int, region: Region, small: bool, past_query_block: bool = False) -> dict:
    """The corner's concrete values for an sdpa case inside ``region`` (what strategies.py reads;
    ``past_query_block``: _length_pair's)."""
    small = small and not corner.get("kernel", False)
    hkv, group = _kv_heads(corner["kv"], region, small)
    lq, lk = _length_pair(corner["lengths"], region, small, past_query_block)
    # Adjusted into a region that takes Lq == Lk only (the longer length: past the block where there is one), or
    # whose causal path declares a length relation (a causal Lq > Lk corner becomes Lq < Lk there).
    if region.equal_lengths or (corner["is_causal"] and region.causal_lengths == "lq==lk"):
        lq = lk = max(lq, lk)
    elif corner["is_causal"] and not causal_lengths_ok(region.causal_lengths, lq, lk):
        lq, lk = lk, lq
    # Fewer heads, then fewer batch entries, where the case would pass the score budget (sdpa_cases counts B * Hq *
    # Lq * Lk; a corner past it draws its lengths instead: the batch-2 corners past a query block fell to Lq 1, Lk 1);
    # the length relation is the corner's point. A grouped corner gives up its batch entry first: its groups are its
    # point too (past a query block, B2 Hkv2 G2 at (129, 192) fell to one query head per kv head, so a compiling
    # implementation's ALiBi and window properties met no grouped corner: an independently written kernel reading the
    # slopes in the wrong GQA head order passed them).
    batch = corner.get("batch", 1)
    while corner["kv"] == "grouped" and batch * hkv * group * lq * lk > COVERING_SCORE_BUDGET and batch > 1:
        batch -= 1
    while batch * hkv * group * lq * lk > COVERING_SCORE_BUDGET and group > 1:
        group //= 2
    while batch * hkv * group * lq * lk > COVERING_SCORE_BUDGET and batch > 1:
        batch -= 1
    while batch * hkv * group * lq * lk > COVERING_SCORE_BUDGET and hkv > 1:
        hkv -= 1
    if small:
        dims = list(range(1, 7))
    else:
        from attention_conformance.conformance.cases.limits import KERNEL_HEAD_DIMS

        dims = region.head_dims.members(sorted(KERNEL_HEAD_DIMS)) or [region.head_dims.min]
        if past_query_block:  # the head dim does not move a query block's bug; Dk 256 at 129 rows cost 4 s of CPU
            dims = [d for d in dims if d <= PAST_QUERY_BLOCK_MAX_DK] or dims[:1]
    dk = dims[-1] if corner["dk"] == "max" else dims[0]
    dv = dk if corner.get("dv") != "other" or region.same_value_dim else (dims[0] if dk != dims[0] else dims[-1])
    return {
        "index": index, "kernel": not small, "B": batch, "Hkv": hkv, "group": group, "is_causal": corner["is_causal"],
        "lengths": (lq, lk), "Dk": dk, "Dv": dv, "mask": corner.get("mask", 0),
        # A scale of a sign the region refuses becomes the default (1/sqrt(Dk), positive).
        "scale": corner["scale"] if scale_ok(region.scale, corner["scale"]) else None,
        "mask_kind": corner.get("mask_kind"),
        "magnitude": corner.get("magnitude", "unit"), "long_cache": corner.get("long_cache", False),
        "causal_only": corner.get("causal_only", False), "window": corner.get("window"),
        "mask_only": corner.get("mask_only", False),
    }


# A compiling implementation's second brief corner of a variant property (properties.covering_corners): the third
# corner past a query block, its queries fewer than its keys (129 against 192 at a block of 64) and its window's right
# edge 33 keys past each query, so that the rows of one query block of 64 or 128 reach across a key block of 64 or
# 128 (an independently written compiled kernel that took a window's last key block from its query block's first row
# passed every run while that corner was small and its right edge 0).
WINDOW_RIGHT_ACROSS_BLOCKS = 33
COMPILED_WINDOW_CORNER = dict(CORNERS[2], lengths="q<k", window=("past", WINDOW_RIGHT_ACROSS_BLOCKS), kernel=True)


def compiled_window_hints(region: Region) -> dict:
    """COMPILED_WINDOW_CORNER made concrete for ``region``, past a query block (under the third corner's index)."""
    return hints_for(COMPILED_WINDOW_CORNER, 2, region, False, past_query_block=True)


def covering_hints(region: Region, small: bool, past_query_block: bool = False) -> list[dict]:
    """Every corner of CORNERS made concrete for ``region`` (``small``: it takes the small shapes;
    ``past_query_block``: _length_pair's)."""
    return [hints_for(corner, i, region, small, past_query_block) for i, corner in enumerate(CORNERS)]

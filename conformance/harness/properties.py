"""How every property test runs: its covering set, its budget of examples, and a bounded failure.

``property_test`` is the outermost decorator of each Hypothesis property (test_properties.py,
test_variants.py, test_mha.py, test_gradients.py, test_dropout.py). For one implementation,
device and dtype it

1. runs the property's deterministic **covering set** (conformance/cases/covering.py): its corners made
   concrete inside the implementation's declared region, each run once; a corner that fails
   fails the test at once, with no shrinking;
2. then draws **random examples** with Hypothesis, as many as the budget below leaves;
3. keeps a failing test **bounded in time**: once an example failed, Hypothesis may shrink it for
   SHRINK_BUDGET_S seconds; past that the smallest failing example found so far is the verdict;
4. keeps **counts honest**: the examples Hypothesis runs while shrinking are not cases; of a
   failing test only the cases judged before its first failure and its final (smallest) failing
   example stay in the session's records.

The budget (docs/speed.md): an implementation that takes the small shapes and calls cheaply
runs the profile's max_examples per property, corners first, at least MIN_RANDOM_EXAMPLES of them
random. An implementation whose calls compile (ARRAY="jax", COMPILED=True) runs at least
FLOOR_PER_PROPERTY judged examples per forward property: six corners, replayed with new values (no
new compile), then a tenth of the profile's random examples. One whose region is narrow
(kernel-shaped cases only) and calls are cheap runs every corner and random draws up to
NARROW_FLOOR_PER_PROPERTY. Either way a default run judges at least 300 sdpa cases of every
implementation (the summary prints the count). An implementation marked ``corners_only`` (a built-in in a run of
the dev profile without --impl: the tour of the built-ins, conformance/plugin.py) runs each corner once, with no
replay, and then Hypothesis's first example alone.
"""
from __future__ import annotations

import contextvars
import functools
import re
import time

import pytest
from hypothesis import settings
from hypothesis.errors import HypothesisException, Unsatisfiable

from attention_conformance.conformance.cases import covering, support
from attention_conformance.conformance.cases.drawing import DerivedCase, drawing_inside, small_shapes_inside
from attention_conformance.conformance.cases.pairwise import pairwise_hints
from attention_conformance.conformance.judging.evidence import remember_call
from attention_conformance.conformance.judging.records import RECORDS
from attention_conformance.implementations.region import EVERYTHING

JIT_EXAMPLE_DIVISOR = 10  # see docs/speed.md: XLA compiles once per distinct input signature


MIN_JIT_EXAMPLES = 1


MIN_RANDOM_EXAMPLES = 2  # random draws a cheap, broad implementation keeps beside its corners


FLOOR_PER_PROPERTY = 12  # judged examples per forward property for a compiling implementation


# ... and for a narrow one whose calls are cheap (a kernel judged on kernel-shaped cases only): a region without
# masks leaves about half the forward properties applicable, so each judges more to keep the run's sdpa floor
# (a Pallas-region stand-in at 12 judged 294 sdpa cases in a default run, its broken twins 182 and 294; at 20,
# 640, 256 and 449).
NARROW_FLOOR_PER_PROPERTY = 25


# A brief covering set (gradients, dropout, variants, MHA): causal Lq < Lk with a negative scale and grouped kv
# heads, Lq > Lk with scale 0, a mask and one kv head, causal Lq = Lk with Hkv = Hq (covering.CORNERS), the first two
# of batch 2; for compiling implementations the first two and covering.COMPILED_BRIEF_CORNER (non-causal, the default
# scale, a float mask (B, Hq, Lq, Lk), batch 2) instead of the third: their random example is Hypothesis's simplest.
BRIEF_CORNERS = (1, 2, 4)


BRIEF_CORNERS_COMPILED = (1, 2, covering.COMPILED_BRIEF_CORNER)


# ... and with kernel corners: the decode corner too (Lq 1 against 193 keys), where a split-KV path takes over.
BRIEF_KERNEL_CORNERS = (1, 2, 3, 4)


SHRINK_BUDGET_S = 15.0  # how long Hypothesis may shrink a failing example (the per-test limit is 120 s)


# A self-check that runs many properties on many correct implementations in one test (tests/battery.py) runs
# the brief covering set and no floor everywhere: the full set is what a user's run gets.
_BRIEF_EVERYWHERE = contextvars.ContextVar("brief_covering_everywhere", default=False)


def brief_covering_everywhere():
    """While active, every property runs its brief covering set and no floor."""
    return covering.context_value(_BRIEF_EVERYWHERE, True)


class ShrinkingStopped(BaseException):
    """The verdict of a failing property once shrinking has run out of time.

    A BaseException, like checks.HungEarlier: Hypothesis lets it through at once instead of
    shrinking further, and pytest reports the test failed with this message (the smallest
    failing example found so far, with its repro).
    """

    def __init__(self, failure: BaseException, seconds: float):
        self.clause = getattr(failure, "clause", None)
        self.record = getattr(failure, "record", None)
        super().__init__(f"{failure}\n\n(Hypothesis shrank this failure for {seconds:.0f} s, the limit "
                         f"SHRINK_BUDGET_S of conformance/harness/properties.py: the case above is the smallest failing "
                         f"one found by then)")


def applicability(requires=None, derives: tuple[DerivedCase, ...] = ()):
    """The ``applies_to`` callable of a property: ``requires(impl)``'s reason, else the first derived case that no
    drawn case could keep inside the implementation's declared region (None: the property applies)."""
    if not requires and not derives:
        return None

    def reason(impl):
        why = requires(impl) if requires else None
        if why or not impl.implements("sdpa"):
            return why
        keywords = impl.accepted_keywords("sdpa")
        return next((r for r in (d.leaves(impl.region, keywords) for d in derives) if r), None)

    return reason


def property_test(test=None, *, min_jit_examples: int = MIN_JIT_EXAMPLES, requires=None, covering_set: str = "full",
                  derives: tuple[DerivedCase, ...] = (), op: str = "sdpa", kernel_corners: bool | str = False,
                  pairs_of: str | None = None):
    """Outermost decorator of every property (the module docstring says what it runs).

    ``covering_set``: "full" (every corner, and the floor) for the properties of a forward operation;
    "brief" (BRIEF_CORNERS, no floor) for gradients, dropout, variants and MHA, whose cases cost a
    backward pass, a compile per variant structure or an MHA pipeline (module docstring, budget);
    "pairwise" (no floor): the corners of conformance/cases/pairwise.py, where every two features of ``pairs_of``
    (default ``op``; "gradients": sdpa's backward) meet.

    A property whose every case was unsupported is skipped, not failed. ``requires(impl)`` may
    return why the property does not apply to an implementation: it becomes the test's
    ``applies_to`` marker, decided at collection (conformance/plugin.py). ``derives``: the cases the
    property makes from the drawn one (strategies.DerivedCase). One that leaves the declared region
    whatever is drawn makes the property not apply (also at collection, "derived case leaves the
    region: ..."); otherwise a draw whose derived case supports(facts) refuses is filtered out while
    drawing, before any call. ``op``: the operation whose signature says which optional keywords the strategies may
    draw (strategies.variant_allowed): sdpa's, or sdpa_varlen's / sdpa_paged's for their properties.
    ``kernel_corners``: every corner kernel-shaped (lengths around a block of 64), also for an implementation that
    takes the small shapes, whose corners are otherwise small but for two: for a property about tiles, whose bugs
    live past a block (its head dims stay the property's own where the region takes them, strategies.sdpa_cases).
    ``kernel_corners=UNLESS_COMPILED``: the same for an implementation that does not compile per input signature
    (a compiling one takes the small corners: each kernel-shaped one is another compile).
    """
    if test is None:
        return functools.partial(property_test, min_jit_examples=min_jit_examples, requires=requires,
                                 covering_set=covering_set, derives=derives, op=op, kernel_corners=kernel_corners,
                                 pairs_of=pairs_of)
    if covering_set not in ("full", "brief", "pairwise"):
        raise ValueError(f"covering_set={covering_set!r}: 'full', 'brief' or 'pairwise'")

    @functools.wraps(test)
    def run(*args, **kwargs):
        impl = kwargs.get("impl")
        region = impl.region if impl is not None else EVERYTHING
        # Hypothesis keeps the profile chosen at decoration on the test; a budget of its own for this call only.
        base = test._hypothesis_internal_use_settings
        support.reset_support_counts()
        depth = "brief" if _BRIEF_EVERYWHERE.get() and covering_set != "pairwise" else covering_set
        drawing = {"dtype": kwargs["dtype"], "device": kwargs["device"]} if "dtype" in kwargs else {}
        keywords = impl.accepted_keywords(op) if impl is not None and impl.implements(op) else None
        try:
            with drawing_inside(region, drawing, derives, keywords) as drawn:
                if depth == "pairwise":
                    corners = pairwise_hints(region, keywords, small_shapes_inside(region), pairs_of or op)
                else:
                    corners = covering_corners(impl, region, depth, kernel_corners)
                floor = (FLOOR_PER_PROPERTY if impl is None or impl.compiled else NARROW_FLOOR_PER_PROPERTY) \
                    if depth == "full" else 0
                replay = floor if impl is not None and impl.compiled and not corners_only(impl) else 0
                judged = run_covering_set(test, corners, args, kwargs, target=replay)
                examples = random_examples(impl, region, base.max_examples, judged, min_jit_examples,
                                           floor=floor)
                test._hypothesis_internal_use_settings = settings(base, max_examples=examples)
                with bounded_failure(test):
                    return test(*args, **kwargs)
        except Unsatisfiable:
            refused = drawn.most_refused()
            if refused:  # every draw was filtered out while drawing: nothing was called
                pytest.skip(f"{refused} (for every draw; nothing was called)" if refused.startswith("derived") else
                            f"unsupported: no generated case lies inside the region (most often: {refused})")
            pytest.skip(f"unsupported: every generated case was unsupported ({support.LAST_UNSUPPORTED[0]})")
        finally:
            test._hypothesis_internal_use_settings = base

    run.kernel_corners = kernel_corners  # what the self-checks read
    applies = applicability(requires, derives)
    return pytest.mark.applies_to.with_args(applies)(run) if applies else run  # with_args: the argument is a callable


def random_examples(impl, region, profile_examples: int, judged: int, min_jit_examples: int,
                    floor: int = FLOOR_PER_PROPERTY) -> int:
    """How many random examples Hypothesis draws after ``judged`` covering cases (module docstring); one for an
    implementation marked ``corners_only``."""
    if corners_only(impl):
        return 1
    compiled = impl is not None and impl.compiled
    if compiled:
        random = max(min_jit_examples, profile_examples // JIT_EXAMPLE_DIVISOR)
    else:
        random = max(MIN_RANDOM_EXAMPLES, profile_examples - judged)
    if compiled or not small_shapes_inside(region):
        random = max(random, floor - judged)
    return max(1, random)


def corners_only(impl) -> bool:
    """Whether the run tours ``impl`` (a built-in in a dev-profile run without --impl, conformance/plugin.py): each
    corner once, no replay, one Hypothesis example."""
    return bool(getattr(impl, "corners_only", False))


# ------------------------------------------------------------------ the covering set
_SEED_WORDS = re.compile(r"\bseed=\d+")


def _same_structure(value) -> str:
    """What two corners that built the same case share: the label without its values seed."""
    label = getattr(value, "label", None)
    return _SEED_WORDS.sub("", label) if label is not None else repr(value)


# kernel_corners=UNLESS_COMPILED: the window, softcap, ALiBi, query-offset, key-lengths and learnable-sink properties,
# whose tiled kernels' bugs live in the key blocks a window or a causal band leaves whole, past a kernel's first query
# block of 128 rows, or in its split-KV decode path (independently written kernels that skipped the softcap there, added
# the sink once per key block, cut the window's last key block at a query block's first row, measured ALiBi from the row
# inside its query block, masked key lengths in the last key block only, or forgot the sink in split-KV decode passed
# default runs). Their corners "q>k" and "q=k" go one past 128 rows (covering._length_pair) and the brief set adds
# decode. Kernel-shaped corners there and in causal-with-mask cost the compiling built-ins 29 s of CPU cold (19.5 ->
# 48.4 s, mostly XLA compiles), the others 0.5 s warm. A compiling implementation gets two: its first brief corner (an
# independently written Pallas kernel whose causal key-block bound floored query_offset to its block passed every run on
# small corners) and its second, non-causal one with a window's right edge across key blocks
# (covering.COMPILED_WINDOW_CORNER).
UNLESS_COMPILED = "unless compiled"


def covering_corners(impl, region, covering_set: str, kernel_corners: bool | str = False) -> list[dict]:
    """The corners (covering.covering_hints) a property runs on this implementation (``kernel_corners``: each
    kernel-shaped, property_test)."""
    compiled = impl is not None and impl.compiled
    small = small_shapes_inside(region)
    # A variant property's kernel-shaped corners reach a second query block of 128 rows; a compiling implementation
    # whose region holds only kernel shapes gets them too (the same number of compiles).
    variant_kernel = kernel_corners == UNLESS_COMPILED
    past_query_block = variant_kernel and (not compiled or not small)
    if variant_kernel:
        kernel_corners = not compiled
    corners = covering.covering_hints(region, small and not kernel_corners, past_query_block=past_query_block)
    if covering_set == "brief":
        brief = BRIEF_KERNEL_CORNERS if past_query_block else BRIEF_CORNERS
        corners = [corners[i] for i in (BRIEF_CORNERS_COMPILED if compiled else brief)]
        if variant_kernel and compiled:
            # ... the first two past a query block (one program each, as the small ones were): the first, and the
            # non-causal one with a window's right edge across key blocks (COMPILED_WINDOW_CORNER)
            if small:
                corners[0] = covering.covering_hints(region, False, past_query_block=True)[BRIEF_CORNERS_COMPILED[0]]
            corners[1] = covering.compiled_window_hints(region)
    elif compiled:
        corners = corners[:COMPILED_CORNERS]
    return corners


# A compiling implementation reaches its floor by running the corners again with new values (up to this many
# passes in all) rather than by random draws: same shapes, so no new compile (jax_numpy's forward properties,
# two dtypes: 371 compiles with random top-ups).
MAX_COVERING_PASSES = 3


# The corners a compiling implementation runs (each a compile per property): the first six of covering.CORNERS
# still meet causal Lq <, =, > Lk, Hkv = 1 / grouped / Hq, both extreme head dims, zero, negative, positive and
# default scales, decode, and no, boolean, key-padding and float masks; replays reach the floor.
COMPILED_CORNERS = 6


def run_covering_set(test, corners: list[dict], args, kwargs, target: int = 0) -> int:
    """Run the property on each corner of its covering set; returns how many were judged (not skipped).

    A failing corner raises its verdict at once. A corner the implementation does not support,
    or a declared deviation, is passed over as it would be in a random draw. ``target``: further
    passes over the same corners, with other values, until that many were judged.
    """
    given = test.hypothesis._given_kwargs
    inner = test.hypothesis.inner_test
    seen, judged = set(), 0
    passes = [(hints, 0) for hints in corners]
    passes += [(hints, again) for again in range(1, MAX_COVERING_PASSES) for hints in corners]
    for hints, again in passes:
        if again and judged >= target:
            break
        draw = covering.DeterministicDraw(hints["index"] + 1000 * again)
        try:
            with covering.building(hints):
                drawn = {name: draw(strategy, name) for name, strategy in given.items()}
        except (pytest.skip.Exception, covering.CannotBuild):  # no case of this corner inside the region
            continue
        key = (again, *sorted((name, _same_structure(value)) for name, value in drawn.items()))
        if key in seen:
            continue
        seen.add(key)
        try:
            inner(*args, **kwargs, **drawn)
        except (pytest.skip.Exception, pytest.xfail.Exception, covering.CannotBuild):
            continue  # unsupported here, a declared deviation (recorded as such), or a draw in the test refused
        except BaseException as failure:
            remember_call(failure, inner, {**kwargs, **drawn})  # its repro calls the test again with these
            raise
        judged += 1
    return judged


# ------------------------------------------------------------------ a failure bounded in time
class bounded_failure:
    """While active, the test's examples are timed: shrinking stops SHRINK_BUDGET_S after the first failure,
    and on a failure the records of the shrink attempts are dropped (module docstring, 3 and 4)."""

    def __init__(self, test):
        self.test = test
        self.inner = test.hypothesis.inner_test
        self.first_failure: float | None = None
        self.records_before_failure = 0

    def __enter__(self):
        inner = self.inner

        @functools.wraps(inner)
        def timed(*args, **kwargs):
            __tracebackhide__ = True
            before = len(RECORDS)
            try:
                return inner(*args, **kwargs)
            except HypothesisException:
                raise  # a rejected example (unsupported, a declared deviation), not a failure
            except Exception as failure:
                remember_call(failure, inner, kwargs)  # its repro calls the test again with these (repro.py)
                now = time.monotonic()
                if self.first_failure is None:
                    self.first_failure, self.records_before_failure = now, before
                elif now - self.first_failure > SHRINK_BUDGET_S:
                    raise ShrinkingStopped(failure, now - self.first_failure) from failure
                raise
            except BaseException as stop:  # HungEarlier: not shrunk, still reproduced
                remember_call(stop, inner, kwargs)
                raise

        self.test.hypothesis.inner_test = timed
        return self

    def __exit__(self, kind, error, traceback):
        self.test.hypothesis.inner_test = self.inner
        if error is not None and self.first_failure is not None:
            _keep_final_failures(self.records_before_failure)
        return False


def _keep_final_failures(start: int) -> None:
    """Of the records from ``start`` on (the first failing example, shrink attempts, the final replay), keep the
    last failed record of each clause: the smallest failing example Hypothesis reports."""
    tail = RECORDS[start:]
    final = {}
    for record in tail:
        if record.status == "failed":
            final[record.clause] = record
    del RECORDS[start:]
    RECORDS.extend(final.values())

"""Hypothesis strategies of sdpa_sequence_parallel: N devices, the sequence layout, causal or not, grouped and
multi-query heads, windows and sinks that straddle shard boundaries, lengths that N does not divide, the lse
asked for or not, and the cotangents of a gradient case.

Cases are drawn inside what the implementation declares (SEQUENCE_PARALLEL, implementations/sequence_parallel.py):
``drawing_for`` makes its declaration the one the strategy reads, so a case outside it is never drawn. Shapes come
from few buckets (B 1 or 2, Dk 4 or 8, L a small multiple of N): each new shape is another XLA compile for a JAX
implementation. A covering corner (conformance/cases/covering.py) hints its structure by the draws' labels.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import CannotBuild, hint, hinted
from attention_conformance.implementations.region import EVERYTHING, Region
from attention_conformance.implementations.sequence_parallel import SequenceParallelDeclaration, even

# The device counts drawn: N = 2 hides a ring turned the wrong way (r + 1 is r - 1), so 3 and more are drawn too.
WORLD_SIZES = (2, 3, 4, 8)


# A compiling implementation (JAX) compiles its ring once per N, unrolled N steps: its draws stop at 4.
COMPILED_WORLD_SIZES = (2, 3, 4)


# Positions per device (per chunk of two, zigzag) of an even case; a compiling implementation's draws take the
# first only.
SHARD_LENGTHS = (2, 3, 4)


HEAD_MODES = ("mha", "gqa", "mqa")  # Hkv = Hq, Hq / 2, 1


@dataclass(frozen=True)
class DrawingPlan:
    """What the strategies may draw for one implementation: its declaration and whether it compiles."""

    declaration: SequenceParallelDeclaration = SequenceParallelDeclaration()
    compiled: bool = False
    keywords: frozenset | None = None  # the keywords its signature takes (None: any)
    region: Region = EVERYTHING  # its SUPPORTS: head dims, Dv == Dk, grouped heads

    def takes(self, name: str) -> bool:
        return self.keywords is None or name in self.keywords

    def features(self, wanted) -> tuple[str, ...]:
        """Of FEATURES ``wanted``, those its signature takes."""
        needs = {"none": (), "window": ("window",), "sink": ("learnable_sink",), "both": ("window", "learnable_sink")}
        return tuple(f for f in wanted if all(self.takes(name) for name in needs[f]))

    def world_sizes(self) -> tuple[int, ...]:
        drawn = COMPILED_WORLD_SIZES if self.compiled else WORLD_SIZES
        found = tuple(n for n in drawn if n in self.declaration.world_sizes)
        return found or self.declaration.world_sizes[:1]


_PLAN: contextvars.ContextVar[DrawingPlan] = contextvars.ContextVar("sequence_parallel_plan", default=DrawingPlan())


@contextlib.contextmanager
def drawing_for(plan: DrawingPlan):
    """Strategies built inside draw inside ``plan``."""
    token = _PLAN.set(plan)
    try:
        yield
    finally:
        _PLAN.reset(token)


def pick(draw, label: str, choices):
    """A corner's hinted value for ``label`` where ``choices`` hold it, else a draw from them (labelled)."""
    choices = tuple(choices)
    if not choices:
        raise CannotBuild(f"nothing to draw for {label}")
    if hinted(label) and hint(label) in choices:
        return hint(label)
    if hinted(label) and label == "N":  # the corner's device count is not declared: the nearest that is
        below = [n for n in choices if n <= hint(label)]
        return max(below) if below else min(choices)
    return draw(st.sampled_from(choices), label=label)


def _heads(draw, plan: DrawingPlan, world: int) -> tuple[int, int]:
    """(Hq, Hkv): Hq a multiple of N where the implementation needs it (Ulysses), not one otherwise where it can."""
    mode = pick(draw, "heads", HEAD_MODES if plan.region.gqa else ("mha",))
    if plan.declaration.heads_divisible:
        hq = world * pick(draw, "heads per device", (1, 2) if world <= 4 else (1,))
    else:
        hq = pick(draw, "Hq", (2, 3, 4, 6))
    if mode == "gqa" and hq % 2 == 0 and hq > 2:
        return hq, hq // 2
    return hq, (1 if mode == "mqa" else hq)


def _length(draw, plan: DrawingPlan, world: int, layout: str, uneven: bool) -> int:
    per = 2 * world if layout == "zigzag" else world
    shard = pick(draw, "positions per shard", SHARD_LENGTHS[:1] if plan.compiled else SHARD_LENGTHS)
    length = per * shard
    if uneven:
        length += pick(draw, "positions past the even length", tuple(range(1, per)))
    return length


def _window(draw, chunk: int):
    """A window whose edges fall at a shard boundary, one past it or one before it: (left, right), None unbounded."""
    near = sorted({max(0, chunk + d) for d in (-1, 0, 1)} | {max(0, 2 * chunk - 1)})
    left = pick(draw, "window left", (None, *near))
    right = pick(draw, "window right", (0, 1, chunk) if left is None else (None, 0, 1, chunk))
    return left, right


FEATURES = ("none", "window", "sink", "both")  # what straddles the shard boundaries: a window, a sink, both


@st.composite
def sequence_parallel_cases(draw, *, clauses: tuple[str, ...], causal=None, features=("none",), uneven: bool = False,
                            gradients: bool = False) -> Case:
    """A case of sdpa_sequence_parallel inside the active plan (``drawing_for``).

    ``causal``: the values is_causal takes (None: both); ``features``: some of FEATURES, whether the case has a
    window whose edges fall at shard boundaries, a learnable sink, both or neither; ``uneven``: L is not a multiple
    of N (2N zigzag); ``gradients``: the case carries d_out (and d_lse where the lse is returned), the cotangents of
    sum(out * d_out) + sum(lse * d_lse)."""
    plan = _PLAN.get()
    world = pick(draw, "N", plan.world_sizes())
    layout = pick(draw, "layout", plan.declaration.layouts if plan.takes("sequence_layout") else ("contiguous",))
    if uneven and not plan.declaration.uneven_lengths:
        raise CannotBuild("uneven lengths are not declared")
    is_causal = pick(draw, "is_causal", tuple(c for c in ((False, True) if causal is None else causal)
                                              if not c or plan.takes("is_causal")))
    hq, hkv = _heads(draw, plan, world)
    batch = pick(draw, "B", (1,) if plan.compiled else (1, 2))
    length = _length(draw, plan, world, layout, uneven)
    dk = pick(draw, "Dk", plan.region.head_dims.members((8,) if plan.compiled else (4, 8)) or
              (plan.region.head_dims.min,))
    same = plan.compiled or plan.region.same_value_dim
    dv = pick(draw, "Dv", (dk,) if same else tuple(plan.region.head_dims.members((dk, dk // 2))) or (dk,))
    scale = pick(draw, "scale", (None, 0.35, -0.5) if not plan.compiled and plan.takes("scale") else (None,))
    chunk = length // (2 * world if layout == "zigzag" else world)
    feature = pick(draw, "straddling", plan.features(features))
    window = _window(draw, chunk) if feature in ("window", "both") else None
    with_sink = feature in ("sink", "both")
    return_lse = pick(draw, "return_lse", (True, False) if plan.takes("return_lse") else (False,))
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    rng = np.random.default_rng(seed)
    inputs = {"q": rng.standard_normal((batch, hq, length, dk)), "k": rng.standard_normal((batch, hkv, length, dk)),
              "v": rng.standard_normal((batch, hkv, length, dv))}
    if with_sink:
        inputs["learnable_sink"] = 1.5 * rng.standard_normal(hq)
    if gradients:
        inputs["d_out"] = rng.standard_normal((batch, hq, length, dv))
        if return_lse and plan.declaration.lse_gradients:  # float32 values, as the cotangent of a float32 lse
            inputs["d_lse"] = rng.standard_normal((batch, hq, length)).astype(np.float32).astype(np.float64)
    inputs.update(world_size=world, sequence_layout=layout, is_causal=bool(is_causal), scale=scale, window=window,
                  return_lse=bool(return_lse))
    label = (f"N{world} {layout} B{batch} Hq{hq}/Hkv{hkv} L{length} Dk{dk} Dv{dv}{' causal' if is_causal else ''}"
             f"{f' window={window}' if window is not None else ''}{' sink' if with_sink else ''} scale={scale}"
             f"{' lse' if return_lse else ''}{' gradients' if gradients else ''} seed={seed}")
    return Case("sdpa_sequence_parallel", inputs, clauses, label)


def relabelled(case: Case, what: str, **changes) -> Case:
    """The case with ``changes`` to its inputs (a probe of attribution), labelled with ``what``."""
    inputs = {**case.inputs, **changes}
    return Case(case.op, inputs, case.clauses, f"{case.label} [{what}]", case.mask_kind)


def even_length_probe(case: Case) -> Case | None:
    """The case cut to the longest length N (2N zigzag) divides (None: it is even already, or would be empty)."""
    world, layout = case.inputs["world_size"], case.inputs["sequence_layout"]
    length = case.inputs["q"].shape[2]
    per = 2 * world if layout == "zigzag" else world
    cut = length - length % per
    if cut == length or cut == 0:
        return None
    return relabelled(case, f"cut to L = {cut}", **{name: case.inputs[name][:, :, :cut]
                                                   for name in ("q", "k", "v", "d_out", "d_lse")
                                                   if case.inputs.get(name) is not None})


def even_world_probe(case: Case, declaration: SequenceParallelDeclaration) -> Case | None:
    """The same case on 2 devices (None where 2 is not declared or N < 3): a fault that shows on N >= 3 devices and
    not on 2 is in the ring's order (r + 1 and r - 1 are one device only for N = 2). An even case is cut to a length
    2 devices divide evenly; an uneven one is kept only where it stays uneven on 2."""
    world, layout = case.inputs["world_size"], case.inputs["sequence_layout"]
    length = case.inputs["q"].shape[2]
    if world < 3 or 2 not in declaration.world_sizes or (declaration.heads_divisible and case.inputs["q"].shape[1] % 2):
        return None
    if not even(length, world, layout):
        return relabelled(case, "on 2 devices", world_size=2) if not even(length, 2, layout) else None
    per = 4 if layout == "zigzag" else 2
    cut = length - length % per
    arrays = {name: case.inputs[name][:, :, :cut] for name in ("q", "k", "v", "d_out", "d_lse")
              if case.inputs.get(name) is not None}
    return relabelled(case, "on 2 devices" + (f", cut to L = {cut}" if cut != length else ""), world_size=2,
                      **arrays)

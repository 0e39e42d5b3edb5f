"""Hypothesis strategies of softmax: shapes, the axis, magnitudes, -inf entries and long rows."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import hint
from attention_conformance.conformance.cases.limits import MAX_LEN, SCORE_SIGMAS


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
        # The first covering corners (conformance/cases/covering.py) are rows past the widths a kernel chunks at,
        # several of them: a chunked path errs only in rows whose maximum lies past the first chunk.
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


# Every axis of every rank up to SOFTMAX_AXIS_RANKS (conformance/cases/pairwise.py: softmax's axis against its rank),
# on shapes whose sizes all differ, so that an axis moved back by the wrong permutation changes which slices are
# normalised (a softmax whose inverse permutation was wrong only for a leading axis of a 3-d input passed 2 of 4 runs).
SOFTMAX_AXIS_RANKS = 4
SOFTMAX_AXIS_SIZES = (3, 4, 5, 2)


def softmax_axis_pairs() -> list[tuple[int, int]]:
    """(rank, axis) for every rank 1..SOFTMAX_AXIS_RANKS and every axis of it, negative and non-negative."""
    return [(rank, axis) for rank in range(1, SOFTMAX_AXIS_RANKS + 1) for axis in range(-rank, rank)]


@st.composite
def softmax_axis_cases(draw, *, clauses=("softmax.last-axis",)) -> Case:
    """A softmax case of the covering corner's (rank, axis) (``hint("rank")``, ``hint("axis")``), else drawn: sizes
    that all differ, the axis passed whatever its value."""
    rank = hint("rank") or draw(st.integers(1, SOFTMAX_AXIS_RANKS), label="ndim")
    axis = hint("axis") if hint("axis") is not None else draw(st.integers(-rank, rank - 1), label="axis")
    turn = draw(st.integers(0, rank - 1), label="sizes rotated")
    sizes = SOFTMAX_AXIS_SIZES[:rank]
    shape = tuple(sizes[(i + turn) % rank] for i in range(rank))
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    x = np.random.default_rng(seed).standard_normal(shape) * 2.0
    return Case("softmax", {"x": x, "axis": axis}, tuple(clauses), f"shape{shape} axis={axis} seed={seed}")

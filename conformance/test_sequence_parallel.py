"""Sequence-parallel attention, sdpa_sequence_parallel (docs/contract.md; spec/clauses.yaml sp.*), on real process
groups: torch.distributed ranks (gloo) and JAX host devices under shard_map, against the single-device float64
sdpa of the gathered sequence (conformance/harness/sequence_parallel.py runs and judges a case).

Each property runs its corners (N = 3 and more among them: a ring turned the wrong way is invisible on 2 devices;
zigzag and contiguous; causal and not; grouped and multi-query heads), then random draws, all inside the
implementation's SEQUENCE_PARALLEL declaration. The rank pool and the JAX child are started once per process (per
xdist worker) on the first case that needs them, and closed when the session ends.
"""
from __future__ import annotations

import pytest
from hypothesis import given

from attention_conformance.conformance.cases.sequence_parallel import sequence_parallel_cases
from attention_conformance.conformance.harness import process_groups
from attention_conformance.conformance.harness.checks import require_device
from attention_conformance.conformance.harness.sequence_parallel import (
    SequenceParallelJudge,
    needs_gradients,
    needs_uneven_lengths,
    needs_windows_or_sinks,
    sequence_parallel_property,
)

pytestmark = pytest.mark.conformance


sequence_parallel_op = pytest.mark.op("sdpa_sequence_parallel")


@pytest.fixture(scope="session", autouse=True)
def close_process_groups():
    """The rank pool and the JAX child of this process end with the session."""
    yield
    process_groups.close_all()


def check(impl, device, dtype, case):
    require_device(impl, device)
    return SequenceParallelJudge(impl, dtype, device).check(case)


# The corners: "compiled" ones are the corners of an implementation that compiles (JAX), each an XLA compile.
DEFINITION_CORNERS = (
    dict(index=0, N=3, layout="zigzag", is_causal=True, heads="gqa", return_lse=True, compiled=True),
    dict(index=1, N=4, layout="contiguous", is_causal=True, heads="mqa", return_lse=True, compiled=True),
    dict(index=2, N=2, layout="contiguous", is_causal=False, heads="mha", return_lse=False),
    dict(index=3, N=8, layout="zigzag", is_causal=False, heads="gqa", return_lse=True, B=2),
    dict(index=4, N=3, layout="contiguous", is_causal=True, heads="mha", Hq=4, return_lse=True),
)


@sequence_parallel_property(corners=DEFINITION_CORNERS)
@sequence_parallel_op
@given(case=sequence_parallel_cases(clauses=("sp.definition", "sp.layout", "sp.heads")))
def test_sequence_parallel_matches_gathered_sdpa(impl, device, dtype, case):
    """Every device's shard of the output (and of lse) is its shard of the gathered sequence's sdpa, whatever N, the
    layout, the causal band and the head grouping."""
    check(impl, device, dtype, case)


WINDOW_SINK_CORNERS = (
    dict(index=0, N=3, layout="contiguous", is_causal=True, heads="gqa", straddling="both", return_lse=True,
         compiled=True),
    dict(index=1, N=4, layout="zigzag", is_causal=False, heads="mha", straddling="sink", return_lse=True),
    dict(index=2, N=2, layout="contiguous", is_causal=False, heads="mqa", straddling="window", return_lse=False),
)


@sequence_parallel_property(corners=WINDOW_SINK_CORNERS, requires=needs_windows_or_sinks)
@sequence_parallel_op
@given(case=sequence_parallel_cases(clauses=("sp.window-sink",), features=("window", "sink", "both")))
def test_sequence_parallel_windows_and_sinks(impl, device, dtype, case):
    """A window whose edges fall at shard boundaries, and a learnable sink counted once, not once per device."""
    check(impl, device, dtype, case)


UNEVEN_CORNERS = (
    dict(index=0, N=3, layout="contiguous", is_causal=True, heads="gqa", return_lse=True),
    dict(index=1, N=4, layout="zigzag", is_causal=False, heads="mha", return_lse=True),
    dict(index=2, N=8, layout="contiguous", is_causal=True, heads="mqa", return_lse=False),
)


@sequence_parallel_property(corners=UNEVEN_CORNERS, requires=needs_uneven_lengths)
@sequence_parallel_op
@given(case=sequence_parallel_cases(clauses=("sp.uneven",), uneven=True))
def test_sequence_parallel_uneven_lengths(impl, device, dtype, case):
    """L not a multiple of N (of 2N zigzag): np.array_split's shards, of unequal lengths."""
    check(impl, device, dtype, case)


GRADIENT_CORNERS = (
    dict(index=0, N=3, layout="contiguous", is_causal=True, heads="gqa", straddling="sink", return_lse=True,
         compiled=True),
    dict(index=1, N=4, layout="zigzag", is_causal=False, heads="mha", straddling="none", return_lse=False),
    dict(index=2, N=2, layout="contiguous", is_causal=True, heads="mqa", straddling="both", return_lse=True),
)


@sequence_parallel_property(corners=GRADIENT_CORNERS, requires=needs_gradients)
@sequence_parallel_op
@given(case=sequence_parallel_cases(clauses=("sp.gradients",), features=("none", "sink", "both"), gradients=True))
def test_sequence_parallel_gradients(impl, device, dtype, case):
    """dq, dk, dv of every device's shard, and dsink summed over the devices, for the cotangents of the output and
    of lse: a ring's backward carries dk and dv round the ring and home."""
    check(impl, device, dtype, case)

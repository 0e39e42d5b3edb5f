"""``--longest-first DURATIONS.json``: the items with the longest measured durations start first.

pytest-xdist hands out items in collection order, and in chunks: ``--dist worksteal`` (the suite's default) gives
each of the N workers one contiguous Nth of the list at the start and later moves the tail of the longest queue to
a worker that ran out; ``--dist load`` gives each worker a contiguous chunk of a quarter of its share first, then
more from the head of the list as workers finish. A complete run of the built-ins on a GPU (16 workers, 2026-11-27)
had its longest items (torch_flex's compiles, 30-120 s each) in one worker's chunk; the others stole them near the
end, so every worker ended on one of them and the run lasted the busiest worker's 377 s against a mean of 328 s
(docs/gpu.md, "Where a GPU run's time goes").

The order is a function of the collected items, the durations file and the number of workers alone, so every
xdist worker computes the same one (xdist refuses a run whose workers collected different orders):

* the priority list: the items the file measured, longest first (equal durations in collection order), then those
  it did not measure, in collection order;
* under ``worksteal`` the list is dealt into the N chunks xdist will cut (their sizes as xdist computes them): each
  item in turn to the chunk with the least measured seconds that still has room, each chunk keeping the priority
  order. So each worker starts on one of the N longest items, and a steal takes a queue's short tail;
* under ``load`` the first N chunks (xdist's first batch) are dealt the same way, the rest follows in priority
  order; otherwise (one process, other ``--dist`` modes) the priority list itself.

An item the file lacks weighs, for the dealing, the median of its test function's measured items, else the
median of all (conformance/reporting/shards.py, ``Weights``). The controller tells each worker its ``--dist`` and
``--maxschedchunk`` (``node_input``): a worker's own options say ``--dist no``.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from attention_conformance.conformance.reporting.shards import Weights, read_durations

DIST_KEY = "attention_conformance_dist"  # workerinput: the controller's (--dist, --maxschedchunk)


DURATIONS_KEY = pytest.StashKey[dict]()  # the --longest-first file's nodeid -> seconds, read once per process


def priority(nodeids: list[str], durations: dict[str, float]) -> list[int]:
    """Indices of ``nodeids``: the measured ones longest first (ties in collection order), then the rest in order."""
    measured = sorted((i for i, nodeid in enumerate(nodeids) if nodeid in durations),
                      key=lambda i: (-durations[nodeids[i]], i))
    return measured + [i for i, nodeid in enumerate(nodeids) if nodeid not in durations]


def worksteal_chunks(count: int, workers: int) -> list[int]:
    """The sizes of the contiguous chunks ``--dist worksteal`` sends N idle workers at the start (xdist 3.x:
    ``len(pending) // nodes_remaining`` for each in turn)."""
    sizes, left = [], count
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def load_chunk(count: int, workers: int, maxschedchunk: int | None) -> int:
    """The size of each worker's first chunk under ``--dist load`` (0: xdist deals one item at a time instead)."""
    if count < 2 * workers:
        return 0
    return max(min(count // workers // 4, maxschedchunk if maxschedchunk is not None else count), 2)


def deal(order: list[int], weights: list[float], sizes: list[int]) -> list[list[int]]:
    """``order`` dealt into chunks of these sizes: each index to the chunk with the least weight so far among those
    with room (ties to the lowest chunk), so the longest items land one per chunk; each chunk keeps their order."""
    chunks: list[list[int]] = [[] for _ in sizes]
    totals = [0.0] * len(sizes)
    for index in order:
        target = min((c for c in range(len(sizes)) if len(chunks[c]) < sizes[c]), key=lambda c: (totals[c], c))
        chunks[target].append(index)
        totals[target] += weights[index]
    return chunks


def layout(nodeids: list[str], durations: dict[str, float], workers: int = 0, dist: str = "no",
           maxschedchunk: int | None = None) -> list[int]:
    """The new order, as indices of ``nodeids``, for ``workers`` xdist workers under ``dist`` (0: one process)."""
    order = priority(nodeids, durations)
    if workers < 2 or dist not in ("worksteal", "load"):
        return order
    weigh = Weights(durations)
    weights = [weigh.of(nodeid) for nodeid in nodeids]
    if dist == "worksteal":
        return [index for chunk in deal(order, weights, worksteal_chunks(len(order), workers)) for index in chunk]
    size = load_chunk(len(order), workers, maxschedchunk)
    if size == 0:
        return order
    head = deal(order[:size * workers], weights, [size] * workers)
    return [index for chunk in head for index in chunk] + order[size * workers:]


# ------------------------------------------------------------------ pytest
def read(config) -> dict[str, float] | None:
    """The --longest-first file's durations (None without the option); a file that is not there or not a durations
    file is a usage error, raised while configuring, before any worker starts."""
    name = config.getoption("longest_first", None)
    if not name:
        return None
    if DURATIONS_KEY not in config.stash:
        path = Path(name) if Path(name).is_absolute() else Path(config.invocation_params.dir) / name
        if not path.is_file():
            raise pytest.UsageError(f"--longest-first {name}: no such file (a durations file: {{\"durations\": "
                                    "{nodeid: seconds}}, as `benchmarks/gpu_run_profile.py --durations-out` writes)")
        config.stash[DURATIONS_KEY] = read_durations(path, option="--longest-first")[0]
    return config.stash[DURATIONS_KEY]


def node_input(node) -> None:
    """pytest_configure_node, on the controller: the scheduler's mode, which the worker's own options no longer say."""
    config = node.config
    node.workerinput[DIST_KEY] = (config.getoption("dist", "no"), config.getoption("maxschedchunk", None))


def apply(config, items) -> None:
    """pytest_collection_modifyitems, last: reorder ``items`` in place (nothing without --longest-first)."""
    durations = read(config)
    if durations is None or len(items) < 2:
        return
    workerinput = getattr(config, "workerinput", None) or {}
    dist, maxschedchunk = workerinput.get(DIST_KEY, ("no", None))
    order = layout([item.nodeid for item in items], durations, int(workerinput.get("workercount", 0) or 0), dist,
                   maxschedchunk)
    items[:] = [items[i] for i in order]

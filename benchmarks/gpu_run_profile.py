"""Where a GPU run's time went, from its log and its JSON report, and what longest-first ordering would make of it.

    python benchmarks/gpu_run_profile.py gpu-run/gpu.log.gz --report gpu-run/gpu.json.gz
    python benchmarks/gpu_run_profile.py LOG --report REPORT --durations-out docs/gpu-runs/durations-cuda.json
    python benchmarks/gpu_run_profile.py LOG --report REPORT --order collected.txt   # also simulate that order

LOG is the log of ``benchmarks/gpu_run.sh`` (pytest ``-v`` under xdist, ``--durations 25``), plain or gzipped;
REPORT its ``--conformance-report`` (plain or gzipped), whose ``durations`` hold every item's measured seconds
(setup + call + teardown). Without a report only the log's own figures are printed.

What it prints:

* the run: its result line, workers, items, versions, commit and devices (from the report);
* the work: the items' seconds in all, per worker (each ``[gwN]`` result line names the worker that ran the item),
  and what lies outside them: the wall time less the busiest worker's item seconds (start-up: the interpreter,
  the plugin, collecting every item in every worker; the time between items; the end: the summary and the report);
* the timeline, taking every worker to start at the same moment and run its items back to back (the log's order of
  result lines is checked against that model: the largest disagreement is printed): when the first worker ran
  out of work, the idle worker-seconds in the tail, and the item each worker ended on;
* the time by implementation (compiling ones marked: JAX's, through XLA, and torch.compile's) and milliseconds per
  case judged, by test function, and the longest items;
* a simulation of the same items on the same number of workers (pytest-xdist's own scheduler, driven by the measured
  durations): in the recorded order when ``--order`` gives it (one node id a line, as ``pytest --collect-only -q``
  prints it), longest first as ``--longest-first`` lays it out for ``worksteal`` and ``load``, longest first with no
  layout, and greedy list scheduling (each free worker takes the longest item left). Each estimate adds the
  recorded run's time outside the items. It assumes each item takes what it took in the recorded run, wherever it
  runs: a compile shared by several items is paid by whichever runs first, and a worker running items of more
  implementations than before pays their warm-up (a framework's import and first compile) again.

``--durations-out PATH`` writes the report's durations as a durations file for ``--longest-first`` (and
``--shard-durations``).
"""
from __future__ import annotations

import argparse
import gzip
import heapq
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
RESULT = re.compile(r"^\[(gw\d+)\] \[ *\d+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+)")
ALONE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")  # -v in one process
SLOWEST = re.compile(r"^([\d.]+)s (setup|call|teardown) +(\S+)")
WORKERS = re.compile(r"^(?:(\d+) workers \[|(?:collecting \.\.\. )?collected )(\d+) items?")
WALL = re.compile(r" in ([\d.]+)s")


def read_text(path: str) -> str:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
        return handle.read()


def parse_log(text: str) -> SimpleNamespace:
    log = SimpleNamespace(workers=0, items=0, results=[], slowest=[], final="", wall=None,
                          interrupted="KeyboardInterrupt: SIGTERM" in text or "!!!!!!! KeyboardInterrupt" in text)
    for line in text.splitlines():
        if m := RESULT.match(line):
            log.results.append((m[1], m[3], m[2]))
        elif m := ALONE.match(line):
            log.results.append(("gw0", m[1], m[2]))
        elif m := SLOWEST.match(line):
            log.slowest.append((float(m[1]), m[2], m[3]))
        elif m := WORKERS.match(line):
            log.workers, log.items = int(m[1] or 0), int(m[2])
        elif line.startswith("=") and (m := WALL.search(line)) and re.search(r"\d+ (passed|failed|skipped|error|"
                                                                             r"deselected)|no tests ran", line):
            log.final, log.wall = line.strip("= "), float(m[1])
    log.workers = log.workers or len({worker for worker, _, _ in log.results})
    return log


def implementation_of(nodeid: str, names: list[str]) -> str:
    """The implementation in an item's parameters (``[impl-device-dtype]``, a fixture's ``[case-impl-device-…]``)."""
    params = nodeid.partition("[")[2]
    for name in sorted(names, key=len, reverse=True):
        if params.startswith(name + "-") or f"-{name}-" in params or params.rstrip("]") == name:
            return name
    return "(none)"


def compiling(report: dict) -> set[str]:
    """The implementations that compile per input signature: JAX's (XLA) and those declaring COMPILED."""
    try:
        sys.path.insert(0, str(ROOT))
        from attention_conformance.implementations.builtin import BUILTINS

        declared = {cls.NAME for cls in BUILTINS if getattr(cls, "COMPILED", False)}
    except ImportError:
        declared = {"torch_flex", "torch_flex_cpu"}
    return {i["name"] for i in report.get("implementations", []) if i.get("array") == "jax" or i["name"] in declared}


# ------------------------------------------------------------------ simulation
class _Node:
    """A worker as xdist's scheduler sees it: a queue it runs in order, one item ahead (xdist's worker runs an item
    only once it holds the next one, or its shutdown), and steals answered in full or not at all."""

    def __init__(self, index: int, events: list):
        self.gateway = SimpleNamespace(id=f"gw{index}")
        self.queue, self.current, self.end, self.busy, self.down = [], None, 0.0, 0.0, False
        self.shutting_down, self._events = False, events

    def send_runtest_some(self, indices):
        self.queue.extend(indices)

    def send_runtest_all(self):
        raise NotImplementedError

    def send_steal(self, indices):
        wanted = set(indices)
        stolen = [i for i in self.queue if i in wanted] if wanted <= set(self.queue) else []
        self.queue = [i for i in self.queue if i not in set(stolen)]
        self._events.append(("unscheduled", self, stolen))

    def shutdown(self):
        self.shutting_down = True


def simulate(seconds: list[float], workers: int, dist: str = "worksteal",
             ends: list[float] | None = None) -> tuple[float, list[float]]:
    """The makespan of items taking ``seconds`` (in collection order) on ``workers`` xdist workers under ``dist``
    ("worksteal" or "load"), run by pytest-xdist's own scheduler; and each worker's item seconds. ``ends``, if
    given, receives each item's end time."""
    from xdist.scheduler import LoadScheduling, WorkStealingScheduling

    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None,
                             getoption=lambda name, default=None: None)
    quiet = SimpleNamespace(workstealsched=lambda *args: None, loadsched=lambda *args: None)
    scheduler = (WorkStealingScheduling if dist == "worksteal" else LoadScheduling)(config, quiet)
    events: list = []
    nodes = [_Node(i, events) for i in range(workers)]
    names = [str(i) for i in range(len(seconds))]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, names)
    scheduler.schedule()
    now, running = 0.0, []
    while True:
        while events:
            _, node, stolen = events.pop(0)
            scheduler.remove_pending_tests_from_node(node, stolen)
        for node in nodes:  # an idle worker takes its next item once it holds one more (or is shutting down)
            if node.current is None and node.queue and (len(node.queue) >= 2 or node.shutting_down):
                node.current = node.queue.pop(0)
                node.end = now + seconds[node.current]
                heapq.heappush(running, (node.end, int(node.gateway.id[2:]), node.current))
        if events:
            continue
        if not running:
            if all(not node.queue for node in nodes):
                return now, [node.busy for node in nodes]
            for node in nodes:  # a worker left holding one item: the run is over, it runs its last
                node.shutting_down = True
            continue
        now, index, item = heapq.heappop(running)
        if ends is not None:
            ends.append(now)
        node = nodes[index]
        node.busy += seconds[item]
        node.current = None
        scheduler.mark_test_complete(node, item, seconds[item])
        if scheduler.tests_finished:  # as xdist's controller does after each report
            for other in nodes:
                other.shutdown()


def list_scheduling(seconds: list[float], workers: int) -> float:
    """Greedy list scheduling, longest first: each worker, when free, takes the longest item left."""
    free = [0.0] * workers
    for duration in sorted(seconds, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + duration)
    return max(free)


# ------------------------------------------------------------------ the profile
def show(rows: list[tuple], header: tuple) -> None:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    for row in (header, *rows):
        print("  " + "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths))))


def profile(log: SimpleNamespace, report: dict | None, top: int, order: list[str] | None,
            limit: float | None = None) -> None:
    print(f"run: {log.final or '(no result line)'}; {log.workers} workers, {log.items} items collected, "
          f"{len(log.results)} finished" + ("; stopped by SIGTERM" if log.interrupted else ""))
    if report:
        env = report.get("environment", {})
        versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if k in
                             ("python", "torch", "jax", "numpy", "hypothesis", "pytest"))
        print(f"  commit {report.get('suite', {}).get('commit', '?')[:7]}, {versions}; cuda "
              f"{', '.join(env.get('devices', {}).get('cuda', []) or ['none'])}; report complete: "
              f"{report.get('complete')}")
    if not report or not report.get("durations") or not log.results:
        print("no report durations or no result lines (pytest -v): the log's slowest phases only")
        show([(f"{s:.1f}", phase, nodeid) for s, phase, nodeid in log.slowest[:top]], ("s", "phase", "item"))
        return
    durations = report["durations"]
    names = [i["name"] for i in report.get("implementations", [])]
    busy, count, last = defaultdict(float), defaultdict(int), {}
    worst = previous = 0.0
    for worker, nodeid, _ in log.results:  # busy[worker]: when this item ended, all workers starting at once
        busy[worker] += durations.get(nodeid, 0.0)
        count[worker] += 1
        last[worker] = nodeid
        worst = max(worst, previous - busy[worker])  # a line printed after one the model puts later
        previous = max(previous, busy[worker])
    ran = {nodeid for _, nodeid, _ in log.results}
    total = sum(durations.get(n, 0.0) for n in ran) or 1e-9
    workers = sorted(busy, key=lambda w: int(w[2:]))
    peak = max(busy.values())
    outside = (log.wall - peak) if log.wall else None
    print(f"\nwork: {total:.0f} item-seconds ({len(ran)} items); per worker mean {total / log.workers:.1f} s, "
          f"busiest {peak:.1f} s, least busy {min(busy.values()):.1f} s")
    if outside is not None:
        print(f"  wall {log.wall:.1f} s: outside the items (start-up, between items, the end) {outside:.1f} s "
              "on the busiest worker" + (" (SIGTERM: items cut short are not in the durations)"
                                         if log.interrupted else ""))
    print(f"  timeline (common start, items back to back): the log's order agrees within {worst:.1f} s; the first "
          f"worker ran out of work at {min(busy.values()):.0f} s, the last at {peak:.0f} s; idle in the tail "
          f"{sum(peak - b for b in busy.values()):.0f} worker-seconds")
    rows = [(w, count[w], f"{busy[w]:.1f}", f"{durations.get(last[w], 0):.1f}", last[w]) for w in workers]
    show(rows, ("worker", "items", "busy s", "last s", "last item"))

    compiles = compiling(report)
    summary = report.get("summary", {})
    by_impl, items_of, longest = defaultdict(float), defaultdict(int), defaultdict(float)
    by_function = defaultdict(float)
    for nodeid in ran:
        impl, seconds = implementation_of(nodeid, names), durations.get(nodeid, 0.0)
        by_impl[impl] += seconds
        items_of[impl] += 1
        longest[impl] = max(longest[impl], seconds)
        by_function[nodeid.split("[")[0]] += seconds
    print("\nby implementation (* compiles per input signature):")
    rows = []
    for impl in sorted(by_impl, key=lambda k: -by_impl[k]):
        cases = summary.get(impl, {}).get("cases", 0)
        rows.append((impl + (" *" if impl in compiles else ""), items_of[impl], f"{by_impl[impl]:.0f}",
                     f"{100 * by_impl[impl] / total:.0f}%", f"{longest[impl]:.1f}", cases,
                     f"{1000 * by_impl[impl] / cases:.0f}" if cases else "-"))
    show(rows, ("implementation", "items", "s", "share", "longest s", "cases", "ms/case"))
    share = sum(by_impl[i] for i in compiles)
    print(f"  compiling implementations: {share:.0f} s, {100 * share / total:.0f}% of the item time")
    print(f"\nby test function (top {top}):")
    show([(f"{s:.0f}", f) for f, s in sorted(by_function.items(), key=lambda kv: -kv[1])[:top]], ("s", "function"))
    print(f"\nlongest items (top {top}):")
    where = {nodeid: (worker, outcome) for worker, nodeid, outcome in log.results}
    show([(f"{durations[n]:.1f}", *where[n], n) for n in sorted(ran, key=lambda n: -durations.get(n, 0))[:top]],
         ("s", "worker", "outcome", "item"))
    if log.slowest:
        setups = [(s, n) for s, phase, n in log.slowest if phase != "call"]
        print(f"  the log's {len(log.slowest)} slowest phases: {len(setups)} setup/teardown"
              + (f" (longest {setups[0][0]:.1f} s)" if setups else ""))
    if log.interrupted:
        print("\n(stopped by SIGTERM: the items it cut short are missing from the simulation, and its time outside "
              "the items includes them)")
    simulate_orders(durations, ran, log.workers, outside or 0.0, peak, order, limit)


def simulate_orders(durations, ran, workers, outside, peak, order, limit=None) -> None:
    from attention_conformance.conformance.reporting.ordering import layout

    nodeids = sorted(ran) if order is None else [n for n in order if n in durations]
    seconds = [durations.get(n, 0.0) for n in nodeids]
    total = sum(seconds)
    print(f"\nsimulated on {workers} workers ({len(nodeids)} items, {total:.0f} s; + {outside:.1f} s outside the "
          "items, as recorded):")
    header = ("order", "items s", "wall s") + ((f"items done by {limit:g} s",) if limit else ())

    def row(name: str, laid: list[int] | None, dist: str = "worksteal") -> tuple:
        ends: list[float] = []
        span, _ = simulate([seconds[i] for i in laid] if laid is not None else seconds, workers, dist, ends)
        done = (f"{sum(end <= limit - outside for end in ends)} of {len(ends)}",) if limit else ()
        return (name, f"{span:.0f}", f"{span + outside:.0f}") + done

    rows = [("recorded run (the busiest worker)", f"{peak:.0f}", f"{peak + outside:.0f}") + (("",) if limit else ())]
    if order is not None:
        rows.append(row("worksteal, the order given", None))
    for dist in ("worksteal", "load"):
        rows.append(row(f"{dist}, --longest-first", layout(nodeids, durations, workers, dist), dist))
    rows.append(row("worksteal, longest first without the layout", layout(nodeids, durations)))
    span = list_scheduling(seconds, workers)
    blank = ("",) if limit else ()
    rows.append(("greedy list scheduling, longest first", f"{span:.0f}", f"{span + outside:.0f}") + blank)
    bound = max(total / workers, max(seconds, default=0.0))
    rows.append(("lower bound: max(mean per worker, longest item)", f"{bound:.0f}", f"{bound + outside:.0f}") + blank)
    show(rows, header)
    if limit:
        print(f"  items done by {limit:g} s: those ending within {limit - outside:.0f} s of item time (all the time "
              "outside the items counted before them)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", help="the run's log (gpu.log or gpu.log.gz)")
    parser.add_argument("--report", help="the run's JSON report (gpu.json or gpu.json.gz)")
    parser.add_argument("--top", type=int, default=15, help="rows of the longest items and test functions")
    parser.add_argument("--order", help="a collection order to simulate: one node id a line")
    parser.add_argument("--limit", type=float, help="also count the items each simulated order finishes by then")
    parser.add_argument("--durations-out", metavar="PATH", help="write the report's durations as a durations file")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    log = parse_log(read_text(args.log))
    report = json.loads(read_text(args.report)) if args.report else None
    order = None
    if args.order:
        order = [line.strip() for line in read_text(args.order).splitlines() if "::" in line]
    profile(log, report, args.top, order, args.limit)
    if args.durations_out:
        from attention_conformance.conformance.reporting.shards import durations_file

        if not report or not report.get("durations"):
            parser.error("--durations-out needs --report with durations")
        Path(args.durations_out).write_text(durations_file(report["durations"]), encoding="utf-8")
        print(f"\nwrote {args.durations_out}: {len(report['durations'])} items, "
              f"median {statistics.median(report['durations'].values()):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

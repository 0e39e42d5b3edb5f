"""What the pytest plugin (attention_conformance/pytest_plugin.py) delegates to: discovery, parametrisation,
profiles, and the end of the run (summary, coverage rule, report), each done by its own module.

The session's shared state (the implementations loaded, how the run ended) is conformance/harness/session.py;
what a worker hands its controller is conformance/reporting/transport.py; the summary is
conformance/reporting/summary.py, the report conformance/reporting/json_report.py.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import sys
from importlib import metadata
from pathlib import Path

import pytest

from attention_conformance.conformance.cases.fixtures import fixtures
from attention_conformance.conformance.harness import session
from attention_conformance.conformance.harness.checks import absent_device_reason, array_devices
from attention_conformance.conformance.harness.session import (
    IMPLS_KEY,
    TOUR_LEFT_OUT_KEY,
    USER_NAMED_KEY,
    implementations,
)
from attention_conformance.conformance.judging import evidence
from attention_conformance.conformance.reporting import summary
from attention_conformance.conformance.specdata import SpecError, clauses
from attention_conformance.implementations.arrays import (
    DECLARABLE_DTYPE_NAMES,
    DTYPE_NAMES,
    EIGHT_BIT_DTYPE_NAMES,
    device_names,
    dtype_unavailable_reason,
)
from attention_conformance.implementations.registry import (
    Implementation,
    ImplementationLoadError,
    builtin_implementations,
    load_implementation,
)

ENV_VAR = "ATTENTION_CONFORMANCE_IMPL"


ENTRY_POINT_GROUP = "attention_conformance.implementations"


# ------------------------------------------------------------------ discovery
def discover(config) -> list[Implementation]:
    """--impl, else $ATTENTION_CONFORMANCE_IMPL; without either, built-ins plus entry points."""
    specs = list(config.getoption("impl"))
    if not specs and os.environ.get(ENV_VAR):
        specs = [s.strip() for s in os.environ[ENV_VAR].split(",") if s.strip()]
    if specs:
        return [load_implementation(spec) for spec in specs]
    found = [] if config.getoption("no_builtins") else builtin_implementations()
    if found and touring_builtins(config) and not config.getoption("list_impls", default=False):
        found, config.stash[TOUR_LEFT_OUT_KEY] = builtin_tour(found)  # (--list-impls prints the whole catalogue)
    builtin_count = len(found)
    found.extend(_entry_point_implementations())
    config.stash[USER_NAMED_KEY] = {impl.name for impl in found[builtin_count:]}
    return found


# The dev profile (the default) tours the built-ins: a bare `pytest` shows the frameworks' attention judged on every
# test, dtype and covering corner, each corner once and then Hypothesis's first example (its simplest case: in effect
# the corners alone), and leaves out the suite's own arithmetic (REFERENCE_BUILTINS) where a framework is installed.
# What it is for, and what each part costs against a peer suite's run: docs/speed.md. --impl and entry points name
# implementations to validate: they get the profile's full budget, as do the built-ins under --hypothesis-profile ci
# or thorough (CI's run, the GPU run).
def touring_builtins(config) -> bool:
    """Whether this run is the dev profile's tour of the built-ins (no other profile named)."""
    return (config.getoption("hypothesis_profile", default=None) or "dev") == "dev"


def builtin_tour(impls: list[Implementation]) -> tuple[list[Implementation], tuple[str, ...]]:
    """(the built-ins a dev-profile run without --impl judges, each marked ``corners_only`` (properties.py); the names
    of those it leaves out). The reference built-ins are left out where torch or JAX is installed (without either they
    are all a bare run can judge). find_spec: the controller imports no framework."""
    from attention_conformance.implementations.builtin import REFERENCE_BUILTINS

    framework = any(importlib.util.find_spec(name) is not None for name in ("torch", "jax"))
    left_out = tuple(impl.name for impl in impls if framework and impl.name in REFERENCE_BUILTINS)
    kept = [impl for impl in impls if impl.name not in left_out]
    for impl in kept:
        impl.corners_only = True
    return kept, left_out


def _entry_point_implementations() -> list[Implementation]:
    found = []
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        spec = entry.value
        try:
            obj = entry.load()
        except Exception as exc:
            raise ImplementationLoadError(
                f"entry point {entry.name!r} ({spec}) in {ENTRY_POINT_GROUP}: cannot load: {type(exc).__name__}: {exc}"
            ) from None
        from attention_conformance.implementations.registry import from_object

        found.append(from_object(obj, entry.name, spec))
    return found


def load_suite_modules() -> None:
    """Import every module of the suite now, in every process, before any test runs.

    Hypothesis draws some values from the constants of the "local" modules loaded so far (those outside
    site-packages: in a checkout, the suite's own). A module the suite imports lazily (the repro writer at a first
    failure, the report at the end) would change those constants mid-run, so that the same derandomized property
    drew other examples depending on which tests ran before it in its process: a shard of a run (--shard) drew
    other float32 cases of test_default_scale than the whole run. Loaded up front, the set is the same in every
    process of every run."""
    import importlib
    import pkgutil

    from attention_conformance import conformance, implementations

    for package in (conformance, implementations):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not module.name.rpartition(".")[2].startswith("test_"):  # pytest imports the tests at collection
                importlib.import_module(module.name)


def configure(config) -> None:
    """Validate spec/ and fixtures/ and load implementations once; a defect is one usage error."""
    if is_xdist_worker(config) or getattr(config.option, "dist", "no") == "no":  # a process that runs tests
        load_suite_modules()
    try:
        clauses()
        fixtures()
        impls = discover(config)
    except (SpecError, ImplementationLoadError) as exc:
        raise pytest.UsageError(str(exc)) from None
    names = [impl.name for impl in impls]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise pytest.UsageError(f"two implementations share the name(s) {sorted(duplicates)}; set NAME to tell them apart")
    config.stash[IMPLS_KEY] = impls
    config.stash.setdefault(USER_NAMED_KEY, {impl.name for impl in impls})
    _check_repro_bound(config)
    evidence.configure(config)
    configure_runners(config)
    if config.getoption("list_impls"):
        _print_impls(impls)
        pytest.exit("listed implementations", returncode=0)


def _check_repro_bound(config) -> None:
    """--repro-max-files and --repro-max-bytes, checked before anything runs."""
    try:
        bound = evidence.limits(config)
    except ValueError as exc:
        raise pytest.UsageError(f"--repro-max-bytes: {exc}") from None
    if bound.files < 0 or bound.bytes < 0:
        raise pytest.UsageError(f"the repro bound cannot be negative ({bound.describe()})")


def configure_runners(config) -> None:
    """--shard, --longest-first and --baseline (conformance/reporting/shards.py, ordering.py, baseline.py), checked
    before anything runs."""
    from attention_conformance.conformance.reporting import baseline, ordering, shards

    ordering.read(config)

    shard = shards.parse(config.getoption("shard", None))
    if shard is not None:
        if not config.getoption("conformance_report", None) and not is_xdist_worker(config):
            raise pytest.UsageError("--shard needs --conformance-report PATH: `attention-conformance merge` applies "
                                    "the coverage rule to the N shards' reports together (docs/ci.md)")
        config.stash[shards.SHARD_KEY] = shard
    if not is_xdist_worker(config):
        baseline.load(config)


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def share_cores_between_workers(workers: int) -> None:
    """Give each of ``workers`` xdist workers its share of the cores for BLAS, OpenMP and torch.

    Torch and OpenBLAS default to one thread per core in every process; with one
    worker per core their spinning threads fight over the same cores. The
    controller calls this before it starts the workers (pytest_xdist_setupnodes):
    OpenBLAS reads its variable when NumPy is imported, which in a worker is before
    any plugin hook runs, so only an inherited variable reaches it. On the 2-core CI
    machine the NumPy and torch part of `pytest conformance -n 2` took 43 s with the
    variables set inside the workers (too late for NumPy) and 34 s inherited.
    Variables the user set are kept.
    """
    threads = str(max(1, (os.cpu_count() or 1) // max(1, workers)))
    for variable in THREAD_VARIABLES + ("TORCHINDUCTOR_COMPILE_THREADS",):
        os.environ.setdefault(variable, threads)
    # On a GPU, JAX preallocates 75 % of its memory per process: the second worker would find none left and
    # every JAX case fail (measured on an H100 under -n 4). Allocate as needed instead.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


# libgomp, the OpenMP of torch's Linux wheels, has an idle thread spin up to 300,000 times before it sleeps. With
# other processes on the cores that spinning starves the thread the work waits for: a correct torch implementation
# (thousands of small ops, 2 threads on 2 cores busy with two other processes) took 20 s a call instead of 0.13 s
# (one thread) and was failed as hung (30 s limit); with 20,000 spins it took 0.24 s, and 0.11 s (as with 300,000)
# on idle cores. libgomp reads the variable when torch is first imported: before any implementation loads.
OPENMP_SPIN = ("GOMP_SPINCOUNT", "20000")


def bound_openmp_spinning() -> None:
    """Set libgomp's spin count (OPENMP_SPIN) for this process and the workers it starts, unless the user did."""
    os.environ.setdefault(*OPENMP_SPIN)


TORCH_TRACE_LOGGER = "torch.__trace"


def quiet_torch_trace_log() -> bool:
    """Disable torch's structured-trace logger unless $TORCH_TRACE asks for its files (True: disabled).

    torch.compile writes its trace events (empty messages, the payload in metadata, for tlparse) to this
    non-propagating logger whenever it has a handler, and pytest's log capture attaches one to every non-propagating
    logger: on the H100 (2026-11-27) 9,679 of the run log's 21,490 lines were such empty "DEBUG torch.__trace" records
    in the 'Captured log call' sections of torch_flex's failures, between the verdict and the next one."""
    if os.environ.get("TORCH_TRACE"):
        return False
    import logging

    logging.getLogger(TORCH_TRACE_LOGGER).disabled = True
    return True


COMPILATION_CACHE = "attention-conformance"  # under pytest's cache directory: .pytest_cache/d/attention-conformance


FALLBACK_COMPILATION_CACHE = ".attention-conformance"  # under the rootdir, when pytest's cache is off


def session_started(config) -> None:
    """pytest_sessionstart, in every process: the compile caches (share_jax_compilations); the controller, or the
    only process, brings the repro directory within its bound (earlier runs' files, oldest first)."""
    share_jax_compilations(config)
    if not is_xdist_worker(config):
        evidence.prune()


def share_jax_compilations(config) -> None:
    """Point JAX's persistent compilation cache (and torch inductor's) at a directory of the checkout, unless the
    user chose one.

    An XLA compile costs 30-100 ms on the CI machine and every distinct input
    signature compiles (docs/speed.md); the cache lets xdist workers reuse each
    other's compiles and later runs reuse this one's. JAX reads these variables
    when it is first imported, which is after this (frameworks import lazily), and
    xdist workers inherit them; a JAX imported earlier (a conftest.py importing it
    at its top) has its configuration updated too. A cached executable is the very one XLA built, so
    results do not change. The default ("auto") is ``jax/`` under
    ``.pytest_cache/d/attention-conformance/`` (pytest's cache directory, which CI
    caches and ``--cache-clear`` empties), or under ``.attention-conformance/`` with
    ``-p no:cacheprovider``; torch.compile's inductor cache (the CUDA flex built-in)
    goes beside it as ``torchinductor/`` unless $TORCHINDUCTOR_CACHE_DIR is set.
    --jax-compilation-cache=off leaves both as they are; DIR names JAX's directory.
    """
    where = config.getoption("jax_compilation_cache", None) or "auto"
    if where == "off" or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    if where == "auto":
        cache = getattr(config, "cache", None)
        root = (Path(cache.mkdir(COMPILATION_CACHE)) if cache is not None
                else Path(str(config.rootpath)) / FALLBACK_COMPILATION_CACHE)
        path = root / "jax"
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "torchinductor"))
    else:
        path = Path(where)
        if not path.is_absolute():
            path = Path(str(config.rootpath)) / path
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(path)
    # Cache every compile: the defaults skip those under 1 s, which is all of ours.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "config"):
        # Imported before the session (a conftest.py or a plugin importing JAX at its top), JAX read the variables
        # already: without this the cache was silently off for that process (every program compiled afresh: 363
        # backend compiles, 35 s, in a run of the JAX built-ins' tests that takes 22 s with the cache).
        jax.config.update("jax_compilation_cache_dir", str(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs",
                          float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))
        jax.config.update("jax_persistent_cache_min_entry_size_bytes",
                          int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]))


def _print_impls(impls) -> None:
    from attention_conformance.conformance.reporting.list_impls import listing

    print(listing(impls))


def deselect_selfcheck_for_user_impls(config, items) -> None:
    """With --impl the run is about the user's implementation: the suite's self-checks step aside."""
    if not (config.getoption("impl") or os.environ.get(ENV_VAR)):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("selfcheck") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


LARGE_SHAPES_OPT_IN = "opt-in: large shapes (Lk up to 16k) run with --large-shapes"


def skip_large_shapes_unless_opted_in(config, items) -> None:
    """The large_shapes tests (conformance/test_large_shapes.py) skip without --large-shapes; marked at
    collection, so the coverage rule does not expect them judged."""
    if config.getoption("large_shapes", default=False):
        return
    for item in items:
        if item.get_closest_marker("large_shapes"):
            item.add_marker(pytest.mark.skip(reason=LARGE_SHAPES_OPT_IN))


def deselect_absent_devices(config, items) -> None:
    """Items for a device this machine lacks are deselected, not skipped: on a machine without a GPU they were
    a fifth of a default run's items and lines of its progress output. The summary names them in one line per
    device, and the coverage rule still counts them (a --device cuda run without a GPU judges nothing: it fails)."""
    from attention_conformance.conformance.reporting import coverage

    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("absent_device") else keep).append(item)
    if drop:
        coverage.note_absent(drop)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def order_by_implementation(items) -> None:
    """Each implementation's items together (stable within it, in collection order): xdist's worksteal hands each
    worker a contiguous share of the list, so a worker then compiles, warms up and caches for the implementations
    of its share only, and steals whole runs of one implementation's items from the other's tail (default run,
    2 workers: 64 -> 55 s; docs/speed.md)."""
    # Compiling implementations first: the head of a worker's share stays with it and a steal takes the tail. With
    # jax_dpa last in the list, the other worker had stolen part of it and 24 of its programs compiled in both; first,
    # all of its compiles ran in one worker (a cold default run: 286 XLA compiles against 300; its wall time within
    # this machine's noise, 3 runs each way).
    rank: dict[str, tuple[bool, int]] = {}
    for item in items:
        impl = _impl_param(item)
        rank.setdefault(_implementation_of(item), (not getattr(impl, "compiled", False), len(rank)))
    items.sort(key=lambda item: rank[_implementation_of(item)])


def _impl_param(item):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("impl") if callspec else None


def _implementation_of(item) -> str:
    return getattr(_impl_param(item), "name", "")


def order_longest_first(config, items) -> None:
    """--longest-first DURATIONS.json: the longest measured items first, laid out for xdist's scheduler, the same
    order in every worker (conformance/reporting/ordering.py)."""
    from attention_conformance.conformance.reporting import ordering

    ordering.apply(config, items)


def keep_this_shard(config, items) -> None:
    """--shard I/N: the I-th share of the items left after every other deselection (conformance/reporting/shards.py)."""
    from attention_conformance.conformance.reporting import shards

    shards.select(config, items)


# ----------------------------------------------------------- parametrisation
def _selected_devices(config) -> tuple[str, ...]:
    choice = config.getoption("device")
    return device_names() if choice == "all" else (choice,)


def _candidate_devices(config, impl: Implementation) -> list[str]:
    """The devices --device selects that impl's array offers and impl declares (present here or not)."""
    devices = [d for d in array_devices(impl.array) if d in _selected_devices(config)]
    if impl.declared_devices is not None:
        devices = [d for d in devices if d in impl.declared_devices]
    return devices


def _selected_dtypes(config, impl: Implementation, device: str, names=DTYPE_NAMES) -> list[str]:
    """The dtypes among ``names`` that ``impl`` declares on ``device`` and --dtype selects. The 16/32/64-bit tests
    ask for DTYPE_NAMES, the 8-bit ones (the eight_bit mark) for EIGHT_BIT_DTYPE_NAMES: an implementation that
    declares no 8-bit dtype gets no 8-bit item at all, and 8-bit dtypes never reach the other tests."""
    wanted = config.getoption("dtype") or DECLARABLE_DTYPE_NAMES
    return [d for d in names if d in impl.dtypes_on(device) and d in wanted]


def _whole_skip_reason(impl: Implementation, device: str, op: str | None) -> str | None:
    """Why no dtype of ``impl`` can run ``op`` on ``device`` here (None: some can)."""
    if impl.skip_reason:
        return impl.skip_reason
    if device not in impl.devices():
        return absent_device_reason(impl, device)
    if op and not impl.implements(op):
        return f"not implemented: {impl.name} does not expose {op}"
    return None


def implementation_params(config, op: str | None, applies_to=None, dtypes=DTYPE_NAMES):
    """(impl, device, dtype) triples as pytest params; what cannot run here is one skipped param saying why.

    A device that is absent, a framework that is missing or an operation the
    implementation lacks skips every dtype for the same reason, so it is one item
    ``impl-device`` (dtype None), not one per dtype: on a machine without a GPU
    that halves the items, and every item costs a report round trip under xdist.
    Skipping at collection also keeps Hypothesis's engine from starting.
    ``applies_to(impl)`` (a test's ``applies_to`` marker) says why the test does not apply to an
    implementation (no autodiff, no dropout_p, a variant keyword missing), or None: decided here, so the
    coverage rule never expects such an item judged (a run of test_gradients.py alone had failed it for
    the NumPy built-ins).
    """
    params = []
    for impl in implementations(config):
        for device in _candidate_devices(config, impl):
            selected = _selected_dtypes(config, impl, device, dtypes)
            if not selected:
                continue
            reason = _whole_skip_reason(impl, device, op) or (applies_to(impl) if applies_to else None)
            if reason:
                marks = [pytest.mark.skip(reason=reason)]
                if reason == absent_device_reason(impl, device):
                    marks.append(pytest.mark.absent_device(device=device, impl=impl.name))
                params.append(pytest.param(impl, device, None, id=f"{impl.name}-{device}", marks=marks))
                continue
            for dtype in selected:
                missing = dtype_unavailable_reason(dtype)
                marks = [pytest.mark.skip(reason=missing)] if missing else []
                params.append(pytest.param(impl, device, dtype, id=f"{impl.name}-{device}-{dtype}", marks=marks))
    return params


def parametrize(metafunc) -> None:
    names = metafunc.fixturenames
    if not {"impl", "device", "dtype"} <= set(names):
        return
    marker = metafunc.definition.get_closest_marker("op")
    op = marker.args[0] if marker else None
    applies = metafunc.definition.get_closest_marker("applies_to")
    applies = applies.args[0] if applies else None
    if "fixture_case" in names:  # every dtype: each fixture runs in the 8-bit dtypes or in the others (its own)
        triples = implementation_params(metafunc.config, op, applies, DECLARABLE_DTYPE_NAMES)
        metafunc.parametrize(("fixture_case", "impl", "device", "dtype"), _fixture_rows(triples))
        return
    eight_bit = metafunc.definition.get_closest_marker("eight_bit") is not None
    only = metafunc.definition.get_closest_marker("dtypes")  # a property of some dtypes (float16's range, say)
    names = tuple(only.args) if only else EIGHT_BIT_DTYPE_NAMES if eight_bit else DTYPE_NAMES
    triples = implementation_params(metafunc.config, op, applies, names)
    if not triples:  # one item saying why, not pytest's "got empty parameter set for (impl, device, dtype)"
        reason = ("no implementation of this run declares an 8-bit dtype (float8_e4m3fn, float8_e5m2 in DTYPES)"
                  if eight_bit else f"no implementation of this run declares {' or '.join(names)}" if only
                  else "no implementation of this run declares a dtype that --dtype selects")
        triples = [pytest.param(None, None, None, id="none", marks=[pytest.mark.skip(reason=reason)])]
    metafunc.parametrize(("impl", "device", "dtype"), triples)


def _fixture_rows(triples) -> list:
    """Every fixture against every runnable triple; a skipped (impl, device) stays one item per operation."""
    rows, skipped = [], set()
    for fx in fixtures():
        if fx.op == "scores":
            continue  # oracle-only fixtures are checked by the self-check suite
        for p in triples:
            impl, device, dtype = p.values
            if p.marks:
                if p.id not in skipped:
                    skipped.add(p.id)
                    rows.append(pytest.param(None, impl, device, None, id=p.id, marks=p.marks))
                continue
            reason = _whole_skip_reason(impl, device, fx.op)
            if reason:
                key = f"{impl.name}-{device}-{fx.op}"
                if key not in skipped:
                    skipped.add(key)
                    rows.append(pytest.param(None, impl, device, None, id=key, marks=[pytest.mark.skip(reason=reason)]))
                continue
            if fx.runs_in(dtype):  # an 8-bit fixture in the 8-bit dtypes, every other one in the others
                rows.append(pytest.param(fx, impl, device, dtype, id=f"{fx.id}-{p.id}"))
    return rows


# ------------------------------------------------------------- hypothesis
def register_hypothesis_profiles() -> None:
    from hypothesis import HealthCheck, settings

    common = dict(
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                               HealthCheck.function_scoped_fixture],
    )
    settings.register_profile("dev", max_examples=10, **common)
    settings.register_profile("ci", max_examples=25, derandomize=True, database=None, print_blob=True, **common)
    settings.register_profile("thorough", max_examples=100, **common)  # 10x the default (dev)
    settings.load_profile("dev")  # --hypothesis-profile NAME overrides this


# ------------------------------------------------------------- the end of the run
def terminal_summary(terminalreporter, config) -> None:
    from attention_conformance.conformance.reporting import coverage

    summary.terminal_summary(terminalreporter, config)
    lines = coverage.terminal_lines(config)
    if lines:
        terminalreporter.section("attention conformance: coverage", red=True)
        for line in lines:
            terminalreporter.write_line(line)


def is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def start(config) -> None:
    """After configure, in every process of the run: SIGTERM interrupts it as Ctrl-C does (session.py); a worker
    says where it runs, for its controller to stop it."""
    session.install_signal_handlers()
    if is_xdist_worker(config):
        from attention_conformance.conformance.reporting import transport

        transport.announce(config)


def interrupted(excinfo) -> None:
    """pytest_keyboard_interrupt: remember why; the controller stops the workers still running."""
    from attention_conformance.conformance.reporting import transport

    session.keyboard_interrupt(excinfo)
    transport.stop_workers()


def tests_ended() -> None:
    """The run loop ended (all items run, or interrupted): from here on the run writes what it has, and a further
    SIGTERM does not cut that short."""
    session.finishing()


def configure_node(node) -> None:
    """pytest-xdist, on the controller: tell a new worker where to stream what it judges (transport.py) and where
    to save repros (repro.py)."""
    from attention_conformance.conformance.reporting import ordering, transport

    node.workerinput[transport.STREAM_KEY] = transport.open_stream_directory()
    evidence.node_input(node)
    ordering.node_input(node)


def item_done(config) -> None:
    """After each test item: a worker streams the records it judged (a run stopped from outside keeps them)."""
    freeze_after_imports()
    if is_xdist_worker(config):
        from attention_conformance.conformance.reporting import transport

        transport.stream(config)


_MODULES_AT_FREEZE = [0]


FULL_COLLECTION_EVERY = 100  # collections of the middle generation between two full ones (CPython's default: 10)


def freeze_after_imports() -> None:
    """After an item that imported modules (a framework's first use: torch, JAX, dynamo, Hypothesis's parts), move
    every object alive into the collector's permanent generation (gc.freeze). A framework's millions of module
    objects never become garbage, yet every full collection scanned them again: in a default run each worker's full
    collections took 2.2 and 3.5 s (21 and 23 of them), 1.1 and 1.9 s with this, 0.7 and 0.7 s with the threshold
    below. Only the objects made after the freeze are scanned from then on. Nothing is collected first (a full
    collection costs what it saves): an item's cyclic garbage not yet collected at that moment stays, a few times a
    run.

    A full collection also waits for 100 collections of the middle generation, not 10: CPython runs one only when
    the objects waiting for it exceed a quarter of the long-lived ones, and frozen objects do not count, so after
    the freeze full collections came more often than before it (25 and 38 a worker); with this, 11 and 12
    (0.7 s each worker)."""
    if len(sys.modules) != _MODULES_AT_FREEZE[0]:
        _MODULES_AT_FREEZE[0] = len(sys.modules)
        gc.freeze()
        first, second, _ = gc.get_threshold()
        gc.set_threshold(first, second, FULL_COLLECTION_EVERY)


def finish(pytest_session) -> None:
    """At sessionfinish: note how the run ended; a worker hands over what it has; the controller (or the only
    process) merges what dead workers streamed, applies the coverage rule and writes the report."""
    from attention_conformance.conformance.reporting import coverage, transport

    session.finishing()
    if pytest_session.shouldfail or pytest_session.shouldstop:
        session.note_stopped(f"stopped early: {pytest_session.shouldfail or pytest_session.shouldstop}")
    config = pytest_session.config
    if is_xdist_worker(config):
        from attention_conformance.conformance.reporting import shards

        transport.stream(config, final=True)
        coverage.send(config)
        shards.send(config)
        transport.send_to_controller(config)
        return
    streamed = transport.read_unreceived()
    transport.close_stream_directory()
    if streamed:
        session.STATE["detail"] = (f"the records of {len(streamed)} xdist worker(s) that did not report, "
                                   f"{sum(streamed.values())} in all, were read from their streams")
    enforce_coverage(pytest_session)
    finish_runners(pytest_session)


def finish_runners(pytest_session) -> None:
    """The report, compared with --baseline first when one is given (conformance/reporting/baseline.py); a shard that
    drew
    no item exits 0 (conformance/reporting/shards.py)."""
    from attention_conformance.conformance.reporting import baseline, json_report, shards

    config = pytest_session.config
    shards.no_items_is_success(pytest_session, config)
    path = config.getoption("conformance_report", None)
    report = None
    if baseline.BASELINE_KEY in config.stash:
        report = json_report.build_report(config, pytest_session.exitstatus)
        baseline.compare_run(config, pytest_session, report)
    if path:
        json_report.write_report(config, path, pytest_session.exitstatus, report)


def unconfigure() -> None:
    session.restore_signal_handlers()
    evidence.forget()
    # pytest's unraisable-exception cleanup, which runs after this hook, collects garbage five times over; with
    # torch, JAX and a run's Hypothesis data alive each full collection takes 0.6 s (3 s at the end of every
    # worker, measured). One collection here still surfaces whatever cyclic garbage raises when freed; freezing
    # the survivors makes pytest's five collections cheap.
    gc.collect()
    gc.freeze()


def receive_from_worker(node) -> None:
    """The controller merges what a finished xdist worker sent (transport.py) and its coverage counts."""
    from attention_conformance.conformance.reporting import coverage, shards, transport

    transport.receive_from_worker(node)
    coverage.receive(node)
    shards.receive(node)


def logreport(report) -> None:
    """Each item's phase reports, on the controller or the only process (pytest_runtest_logreport)."""
    from attention_conformance.conformance.reporting import baseline, shards

    shards.note_duration(report)
    baseline.note_outcome(report)


def enforce_coverage(pytest_session) -> None:
    """The controller (or the only process) applies the coverage rule (conformance/reporting/coverage.py)."""
    if is_xdist_worker(pytest_session.config):
        return
    from attention_conformance.conformance.reporting import coverage

    config = pytest_session.config
    coverage.enforce(pytest_session, implementations(config), session.user_named(config),
                     lambda impl: _why_not_runnable(config, impl))


def _why_not_runnable(config, impl: Implementation) -> str:
    if impl.skip_reason:
        return impl.skip_reason
    devices = _candidate_devices(config, impl)
    if not devices:
        return (f"--device {config.getoption('device')} selects none of the devices it runs on "
                f"({', '.join(impl.declared_devices or array_devices(impl.array))})")
    present = [d for d in devices if d in impl.devices()]
    if not present:
        return "; ".join(absent_device_reason(impl, d) for d in devices)
    wanted = config.getoption("dtype")
    if wanted and not any(_selected_dtypes(config, impl, d, DECLARABLE_DTYPE_NAMES) for d in present):
        return f"it declares none of --dtype {', '.join(wanted)} on {', '.join(present)}"
    return "every item was deselected or skipped"

"""The attention-conformance pytest plugin, registered through the `pytest11` entry point.

Options, the implementation registry wiring, parametrisation of every conformance test over
implementations x devices x dtypes, Hypothesis profiles, and the end-of-run summary and report.

Installed, the plugin is loaded by every pytest run in the environment, so it stays out of the
way until a run targets the suite ("engaged"): the suite's test package is among the arguments
(`pytest --pyargs attention_conformance.conformance`, or a path inside it), an implementation is
named (--impl, --list-impls), or the run is in the suite's own source checkout. Only then does it
load spec/ and fixtures/, register and load its Hypothesis profiles, default to xdist and set the
defaults the suite's pyproject.toml gives a checkout (pytest reads the ini file of the user's
project, never the suite's): the `conformance`/`selfcheck`/`op`/`large_shapes` markers, a 120 s
per-test timeout, -rExX, and JAX's DeprecationWarnings ignored.

In those runs the per-test timeout raises an exception Hypothesis does not take for a failing example
(conformance/judging/time_limit.py: pytest-timeout's own had Hypothesis shrink past the limit), and SIGTERM
interrupts the run as Ctrl-C does, so a run stopped from outside still prints its summary and writes its
report, marked incomplete (conformance/harness/session.py; under xdist the workers stream what they judge,
conformance/reporting/transport.py).

The root conftest.py of a checkout registers this module when the entry point has not (a checkout
on PYTHONPATH without `pip install`); both use the module's own name, so pytest never registers it twice.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

PLUGIN_NAME = __name__  # the pytest11 entry point's name too: pytest then sees one plugin, whoever loads it
PACKAGE = "attention_conformance"
# The test package's directory: inside this package in a wheel, the top-level conformance/ of a checkout
# (as attention_conformance/__init__.py decides).
SUITE_DIR = Path(__file__).resolve().parent / "conformance"
if not SUITE_DIR.is_dir():
    SUITE_DIR = Path(__file__).resolve().parent.parent / "conformance"
ENGAGED_KEY = pytest.StashKey[bool]()
_ACTIVE: dict = {"config": None}  # the engaged config of this process (hooks without a config argument)
WORKER_KEY = "attention_conformance_engaged"
# What the suite's own ini file sets for a checkout, repeated for runs under another project's ini file.
MARKERS = (
    "conformance: a case run against an implementation",
    "selfcheck: the suite checking itself (deselected with --impl)",
    "op(name): the contract operation a conformance test exercises",
    "applies_to(reason_fn): reason_fn(impl) says why a test does not apply to an implementation (None: it does)",
    "absent_device(device, impl): cases for a device this machine lacks (deselected, counted in the summary)",
    "large_shapes: opt-in sdpa cases at realistic sizes, run with --large-shapes",
    "eight_bit: a test of 8-bit inputs (FP8), parametrised over the 8-bit dtypes an implementation declares only",
    "dtypes(*names): a test parametrised over these dtypes only (of those an implementation declares)",
)
DEFAULT_TIMEOUT = 120  # seconds per test (pytest-timeout), as pyproject.toml's `timeout`
# Errors and declared deviations (xfail/xpass) by name. Not pytest's list of failed tests ("f"): each failure's block
# names its test, and the conformance summary above the list names the causes and clauses (README, "Reading a
# failure"); -rf brings the list back.
DEFAULT_REPORT_CHARS = "ExX"


def pytest_addoption(parser):
    # Every pytest run in an environment with the suite installed registers these options: the choices come
    # from the array adapters alone, not the whole plugin (spec loading, schemas), about 0.2 s less per run.
    from attention_conformance.implementations.arrays import DECLARABLE_DTYPE_NAMES, device_names

    group = parser.getgroup("attention-conformance")
    group.addoption(
        "--impl", action="append", default=[], metavar="MODULE[:ATTR]",
        help="implementation to validate (repeatable). Without it, every built-in and every "
        "implementation found through $ATTENTION_CONFORMANCE_IMPL or entry points runs.",
    )
    group.addoption(
        "--device", choices=device_names() + ("all",), default="all",
        help="devices to test: cpu, cuda, or all (default; cases for a device absent here are deselected, "
             "one summary line per device).",
    )
    group.addoption(
        "--dtype", action="append", default=[], choices=DECLARABLE_DTYPE_NAMES,
        help="restrict to these dtypes (repeatable; default: every dtype each implementation declares).",
    )
    group.addoption("--conformance-report", metavar="PATH", default=None,
                    help="write the JSON conformance report to PATH and an HTML page beside it.")
    group.addoption("--list-impls", action="store_true", default=False,
                    help="print the implementations found, what they declare and support, then exit.")
    group.addoption("--no-builtins", action="store_true", default=False,
                    help="do not add the built-in implementations when no --impl is given.")
    group.addoption("--jax-compilation-cache", metavar="DIR|auto|off", default="auto",
                    help="JAX's persistent compilation cache for this run, relative to the rootdir (default auto: "
                    ".pytest_cache/d/attention-conformance/jax, or .attention-conformance/jax without pytest's cache; "
                    "torch inductor's cache goes beside it; 'off' leaves both alone; $JAX_COMPILATION_CACHE_DIR, "
                    "if set, wins).")
    group.addoption("--call-timeout", metavar="SECONDS", default=None,
                    help="time limit of each call of an implementation (default 30; 0 or off: no limit). A call past "
                    "it fails its case as a hang, and the implementation's later calls fail at once "
                    "(sets $ATTENTION_CONFORMANCE_CALL_TIMEOUT).")
    group.addoption("--min-judged", type=int, default=1, metavar="N",
                    help="coverage floor: each implementation and operation with runnable cases must have at least N "
                    "cases judged (passed, failed or a declared deviation), else the run fails (default 1).")
    group.addoption("--allow-unjudged", action="store_true", default=False,
                    help="report a run that judged too few cases (docs/coverage-and-depth.md) without failing it.")
    group.addoption("--large-shapes", action="store_true", default=False,
                    help="also run conformance/test_large_shapes.py: sdpa at Lk up to 16384, D 128, judged by the "
                    "blocked float64 oracle (slow; see docs/large-shapes.md).")
    _add_repro_options(group)
    _add_runner_options(group)


def _add_repro_options(group) -> None:
    """The bound of the repro directory (conformance/judging/repro_files.py, docs/failures.md)."""
    group.addoption("--repro-max-files", type=int, default=200, metavar="N",
                    help="at most N failures' repro files in the run's repro directory (default 200): earlier runs' "
                    "files make room, oldest first; past that, a failure's block says its repro was not kept.")
    group.addoption("--repro-max-bytes", default="200MB", metavar="SIZE",
                    help="at most SIZE bytes of repro files and their shared arrays in that directory (default 200MB; "
                    "k, M, G suffixes), bounded as --repro-max-files.")


def _add_runner_options(group) -> None:
    """Options for runs across several runners and over time: shards, environment labels, baselines (docs/ci.md)."""
    group.addoption("--shard", metavar="I/N", default=None,
                    help="run the I-th of N shares of the selected items (1 <= I <= N), balanced by measured "
                    "duration; needs --conformance-report. `attention-conformance merge` puts the N reports back "
                    "together and applies the coverage rule to the whole run (docs/ci.md).")
    group.addoption("--shard-durations", metavar="PATH", default=None,
                    help="durations file balancing --shard (default: the suite's conformance/durations.json; "
                    "`attention-conformance merge --durations-out PATH` writes one from a run's reports). A missing "
                    "file is no error: items then weigh by their test function.")
    group.addoption("--longest-first", metavar="DURATIONS.json", default=None,
                    help="start the items with the longest durations in this file first, laid out for xdist's "
                    "scheduler (a GPU run: docs/gpu-runs/durations-cuda.json; docs/gpu.md). Items it lacks follow "
                    "in collection order.")
    group.addoption("--environment-label", metavar="TEXT", default=None,
                    help="name this runner's environment in the report (e.g. the GPU kind of a CI matrix entry): "
                    "merged reports never sum runs with different labels into one cell.")
    group.addoption("--baseline", metavar="OLD.json", default=None,
                    help="compare this run with an earlier report (a runner's or a merged one): clauses newly broken, "
                    "fixed, deviations added or gone, in the summary and the report. The exit status is unchanged.")
    group.addoption("--fail-on-regression", action="store_true", default=False,
                    help="with --baseline: exit 1 when a clause broke that was not broken in the baseline, and 0 "
                    "when every failure was already there (only new breakage fails).")


# ------------------------------------------------------------- engagement
def _within(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def is_source_checkout(rootpath: Path) -> bool:
    """The rootdir is the suite's own repository (its conformance/ is the one this plugin serves)."""
    try:
        return (Path(rootpath) / "conformance").resolve() == SUITE_DIR
    except OSError:
        return False


def targets_suite(args, pyargs: bool, invocation_dir: Path, rootpath: Path, named: bool) -> bool:
    """Whether a run with these positional ``args`` runs the suite (see the module's docstring)."""
    if named or is_source_checkout(rootpath):
        return True
    for arg in args:
        target = str(arg).split("::")[0]
        if pyargs and (target == PACKAGE or target.startswith(PACKAGE + ".")):
            return True
        try:
            if _within((Path(invocation_dir) / target).resolve(), SUITE_DIR):
                return True
        except OSError:
            continue
    return False


def engaged(config) -> bool:
    if ENGAGED_KEY not in config.stash and hasattr(config, "workerinput"):  # an xdist worker: as its controller
        config.stash[ENGAGED_KEY] = bool(config.workerinput.get(WORKER_KEY, False))
    if ENGAGED_KEY not in config.stash:
        option = config.option
        config.stash[ENGAGED_KEY] = targets_suite(
            config.args, bool(getattr(option, "pyargs", False)), config.invocation_params.dir, config.rootpath,
            bool(getattr(option, "impl", None) or getattr(option, "list_impls", False)))
    return config.stash[ENGAGED_KEY]


def _names_workers(args) -> bool:
    return any(arg in ("-n", "--numprocesses") or arg.startswith("--numprocesses=")
               or (arg.startswith("-n") and not arg.startswith("--")) for arg in args)


def _names_distribution(args) -> bool:
    return any(arg in ("--dist", "-d", "--tx") or arg.startswith(("--dist=", "--tx=")) for arg in args)


def _xdist_loaded(pluginmanager) -> bool:
    # "xdist" through its entry point, "xdist.plugin" through `-p xdist.plugin` (plugin autoload off)
    return pluginmanager.hasplugin("xdist") or pluginmanager.hasplugin("xdist.plugin")


def pytest_load_initial_conftests(early_config, parser, args):
    """`-n auto --dist worksteal` by default (docs/speed.md), each part unless the command line names it,
    when pytest-xdist is loaded. Called for plugins loaded by entry point (any install, editable included);
    a checkout that is only on PYTHONPATH gets them from pytest_cmdline_main below. `-n 0` or `-p no:xdist`:
    one process; `--pdb` makes xdist's `-n auto` one process too. In a run of the conformance tests alone, pytest's
    log capture is left out unless the run asks for it (``_leave_log_capture_out``).
    """
    known = early_config.known_args_namespace
    if not targets_suite(known.file_or_dir or [], bool(getattr(known, "pyargs", False)),
                         early_config.invocation_params.dir, early_config.rootpath,
                         bool(getattr(known, "impl", None) or getattr(known, "list_impls", False))):
        return
    _leave_log_capture_out(early_config, args)
    if not _xdist_loaded(early_config.pluginmanager):
        return
    defaults = [] if _names_workers(args) else ["-n", "auto"]
    defaults += [] if _names_distribution(args) else ["--dist", "worksteal"]
    args[:] = [*defaults, *args]


# pytest's ini settings of its log capture, with their defaults: a value other than these asks for the capture.
LOG_INI_DEFAULTS = {"log_cli": False, "log_level": None, "log_cli_level": None, "log_file": None,
                    "log_file_level": None, "log_format": "%(levelname)-8s %(name)s:%(filename)s:%(lineno)d %(message)s",
                    "log_date_format": "%H:%M:%S"}


# On the command line (PYTEST_ADDOPTS and the ini file's addopts included): a --log-* option, -o log_..., -p logging.
LOG_ARGUMENT = re.compile(r"(?:^|\s)(?:--log-|(?:-o|--override-ini)[=\s]?log_|-p\s?(?:pytest_)?logging(?:\s|$))")


def _asks_for_log_capture(early_config, args) -> bool:
    """Whether the run names pytest's logging: on the command line (LOG_ARGUMENT), or a log_* ini setting other than
    pytest's default."""
    if LOG_ARGUMENT.search(" ".join(args)):
        return True
    for name, default in LOG_INI_DEFAULTS.items():
        try:
            if early_config.getini(name) not in (default, "", None):
                return True
        except ValueError:  # an ini name this pytest does not know: its logging is not the one described here
            return True
    return False


def _runs_conformance_tests_alone(early_config) -> bool:
    """Whether every test path of the run lies in the suite's test package (the conformance tests alone: no test of
    the run can ask for caplog)."""
    known = early_config.known_args_namespace
    targets = list(known.file_or_dir or [])
    base = Path(early_config.invocation_params.dir)
    if not targets:
        targets, base = list(early_config.getini("testpaths")) or ["."], Path(early_config.rootpath)
    for target in targets:
        target = str(target).split("::")[0]
        if getattr(known, "pyargs", False) and (target == f"{PACKAGE}.conformance"
                                                 or target.startswith(f"{PACKAGE}.conformance.")):
            continue
        try:
            if not _within((base / target).resolve(), SUITE_DIR):
                return False
        except OSError:
            return False
    return True


def _leave_log_capture_out(early_config, args) -> None:
    """``-p no:logging`` for a run of the conformance tests alone that does not ask for log capture.

    pytest's log capture attaches a handler to the root logger and to every non-propagating logger (torch's and
    JAX's: 42 of a worker's 158 loggers) around each setup, call and teardown: 0.4 ms of CPU per test on the 2-core
    machine, about 1.4 s of a default run's (docs/speed.md). No conformance test reads caplog, and a record an
    implementation logs at WARNING or above still reaches the user: without a handler, Python's logging writes it to
    stderr, which pytest captures and shows with a failed test ("Captured stderr call"). A run that names any of
    pytest's log options or ini settings (``--log-level``, ``--log-cli-level``, ``log_cli = true``, ...) keeps the
    capture, as does one that also runs other tests (the self-checks, a user's own)."""
    if _asks_for_log_capture(early_config, args) or not _runs_conformance_tests_alone(early_config):
        return
    for name in ("logging", "pytest_logging"):  # what `-p no:logging` blocks
        early_config.pluginmanager.set_blocked(name)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The same defaults for a checkout used through PYTHONPATH alone: conftest.py registers this module while
    pytest_load_initial_conftests runs, too late to add arguments, so they are set on the parsed options here,
    before xdist's own pytest_cmdline_main (tryfirst too, registered earlier, so called after this) turns
    ``numprocesses`` into workers. The GPU run of 2026-11-27 (`python -m pytest --device cuda` in a checkout on
    16 cores) ran in one process: 47 % of its items in 400 s."""
    if not _xdist_loaded(config.pluginmanager) or config.getoption("numprocesses", None) is not None \
            or hasattr(config, "workerinput"):  # a worker's numprocesses is None: it must not start workers of its own
        return
    args = config.invocation_params.args
    if _names_workers(args) or not engaged(config):
        return  # (with --pdb, xdist turns "auto" into one process itself)
    config.option.numprocesses = "auto"
    if not _names_distribution(args) and config.option.dist == "no":
        config.option.dist = "worksteal"


def _value_options(parser) -> list[str]:
    """The long names of this plugin's options that take a value (``--opt VALUE``)."""
    group = parser.getgroup("attention-conformance")
    return [name for option in group.options if option.attrs().get("action", "store") in ("store", "append")
            for name in option.names() if name.startswith("--")]


def _refuse_a_rootdir_taken_from_an_option_value(config) -> None:
    """A UsageError where pytest took the value of one of this plugin's options for a test path when it chose the
    rootdir (``--jax-compilation-cache /tmp/cache``: pytest reads its ini file before any plugin's options are
    known, pytest-dev/pytest#8846), so that the run is not one of cryptic errors ("fixture 'impl' not found")."""
    if hasattr(config, "workerinput"):
        return
    args = [str(a) for a in config.invocation_params.args]
    base = Path(config.invocation_params.dir)
    names = set(_value_options(config._parser))
    taken = [(args[i - 1], value) for i, value in enumerate(args[1:], 1)
             if args[i - 1] in names and not value.startswith("-") and (base / value).exists()]
    if not taken:
        return
    try:  # the rootdir pytest chooses from the run's own test paths: pytest's function, its signature checked
        import inspect

        from _pytest.config.findpaths import determine_setup

        options = {"inifile": config.option.inifilename, "args": [str(a) for a in config.option.file_or_dir or []],
                   "rootdir_cmd_arg": config.option.rootdir or None, "invocation_dir": base,
                   "override_ini": config.option.override_ini}
        parameters = inspect.signature(determine_setup).parameters
        expected = Path(determine_setup(**{k: v for k, v in options.items() if k in parameters})[0])
    except Exception:  # another pytest: no verdict rather than a wrong one
        return
    if expected.resolve() != Path(config.rootpath).resolve():
        name, value = taken[0]
        raise pytest.UsageError(
            f"{name} {value}: pytest took {value} for a test path when it chose the rootdir ({config.rootpath}, not "
            f"{expected}), as it does with any plugin option's value written after a space "
            f"(pytest-dev/pytest#8846); write {name}={value}")


# ------------------------------------------------------------- hooks
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    _refuse_a_rootdir_taken_from_an_option_value(config)
    if not engaged(config):
        return
    from attention_conformance.conformance import plugin as support

    # Before Hypothesis's own pytest_configure, which loads --hypothesis-profile by name.
    support.register_hypothesis_profiles()
    _apply_suite_defaults(config)
    if config.getoption("call_timeout") is not None:  # xdist workers inherit it
        os.environ["ATTENTION_CONFORMANCE_CALL_TIMEOUT"] = str(config.getoption("call_timeout"))
    support.bound_openmp_spinning()  # before support.configure imports the implementations
    support.quiet_torch_trace_log()
    support.configure(config)
    support.start(config)
    _ACTIVE["config"] = config


def pytest_sessionstart(session):
    """The compile caches and the repro directory, under pytest's cache directory: it exists only after every
    pytest_configure (pytest's own is tryfirst too, and runs after this plugin's), and this runs before xdist starts
    its workers (its sessionstart is trylast), which inherit the variables, and before any framework is imported."""
    if engaged(session.config):
        from attention_conformance.conformance import plugin as support

        support.session_started(session.config)


def pytest_unconfigure(config):
    if _ACTIVE["config"] is config:
        from attention_conformance.conformance import plugin as support

        support.unconfigure()
        _ACTIVE["config"] = None


# torch 2.13's own import of torch.compile's backend (torch.utils.mkldnn) warns that torch.jit.script_method is
# deprecated: nothing a user of the suite can act on.
TORCH_INDUCTOR_IMPORT_WARNING = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"


def _apply_suite_defaults(config) -> None:
    """What the suite's ini file gives a checkout, for a run under another project's ini file."""
    present = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    for line in MARKERS:
        if line.split(":")[0].split("(")[0] not in present:
            config.addinivalue_line("markers", line)
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:jax.*")
    config.addinivalue_line("filterwarnings", TORCH_INDUCTOR_IMPORT_WARNING)
    if not config.pluginmanager.hasplugin("timeout"):  # its mark is on the large-shape tests; without it, a no-op
        config.addinivalue_line("markers", "timeout(seconds): pytest-timeout's per-test limit (not installed here)")
    if config.option.reportchars == "fE":  # pytest's default: no -r given
        config.option.reportchars = DEFAULT_REPORT_CHARS
    if config.pluginmanager.hasplugin("timeout") and config.getvalue("timeout") is None \
            and not os.environ.get("PYTEST_TIMEOUT") and not config.getini("timeout"):
        config.option.timeout = DEFAULT_TIMEOUT


@pytest.hookimpl(trylast=True)  # after -k and -m: the absent-device count is of the items the run selected
def pytest_collection_modifyitems(config, items):
    if engaged(config):
        from attention_conformance.conformance import plugin as support

        support.deselect_selfcheck_for_user_impls(config, items)
        support.deselect_absent_devices(config, items)
        support.skip_large_shapes_unless_opted_in(config, items)
        support.order_by_implementation(items)
        support.keep_this_shard(config, items)  # the shares are of what every other rule left
        support.order_longest_first(config, items)  # last: the order of what this process runs


def pytest_collection_finish(session):
    """After every deselection (-k, -m, ours): what is left to run is what the coverage rule expects judged."""
    if engaged(session.config):
        from attention_conformance.conformance.reporting import coverage

        coverage.note_collection(session.items)


def pytest_generate_tests(metafunc):
    if engaged(metafunc.config):
        from attention_conformance.conformance import plugin as support

        support.parametrize(metafunc)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After each item (passed, failed or interrupted) an xdist worker streams what it judged to its controller."""
    try:
        return (yield)
    finally:
        if engaged(item.config):
            from attention_conformance.conformance import plugin as support

            support.item_done(item.config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Where the item ran: a failure by verdicts alone is marked so (for --fail-on-regression, conformance/
    baseline.py); a test that failed with verdicts gets their repro files saved and each printed as a short block
    (conformance/reporting/failure_block.py)."""
    report = yield
    if engaged(item.config):
        from attention_conformance.conformance.reporting import baseline

        baseline.mark_verdict(report, call)
        if call.excinfo is not None:
            from attention_conformance.conformance.reporting import failure_block

            failure_block.after_test(item, call, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    """When the tests end (or are interrupted), SIGTERM no longer interrupts: the summary and report are written."""
    try:
        return (yield)
    finally:
        if engaged(session.config):
            from attention_conformance.conformance import plugin as support

            support.tests_ended()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """The per-test time limit repeats only while the test function runs (conformance/judging/time_limit.py)."""
    if not engaged(item.config):
        return (yield)
    from attention_conformance.conformance.judging import time_limit

    time_limit.call_started(item)
    try:
        return (yield)
    finally:
        time_limit.call_ended(item)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout: in the suite's runs the limit raises an exception Hypothesis does not shrink
    (conformance/judging/time_limit.py); None leaves the timer to pytest-timeout."""
    if engaged(item.config):
        from attention_conformance.conformance.judging import time_limit

        return time_limit.set_timer(item, settings)
    return None


def pytest_keyboard_interrupt(excinfo):
    """Ctrl-C, SIGTERM (made a KeyboardInterrupt), pytest.exit or a stopping worker: the report says why."""
    if _ACTIVE["config"] is not None:
        from attention_conformance.conformance import plugin as support

        support.interrupted(excinfo)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if engaged(config):
        from attention_conformance.conformance import plugin as support

        support.terminal_summary(terminalreporter, config)


@pytest.hookimpl(trylast=True)  # under xdist after the controller's teardown of the workers: their streams are whole
def pytest_sessionfinish(session, exitstatus):
    if engaged(session.config):
        from attention_conformance.conformance import plugin as support

        support.finish(session)


def pytest_runtest_logreport(report):
    """Each item's phases, on the controller (xdist forwards the workers' reports) or the only process: its
    measured duration (for --shard) and whether it failed (for --fail-on-regression)."""
    config = _ACTIVE["config"]
    if config is not None and not hasattr(config, "workerinput"):
        from attention_conformance.conformance import plugin as support

        support.logreport(report)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    """pytest-xdist: before the workers start, give each its share of the cores (they inherit the variables)."""
    if engaged(config):
        from attention_conformance.conformance import plugin as support

        support.share_cores_between_workers(len(specs))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist: a worker engages exactly when its controller did (its arguments and directory may differ),
    and streams what it judges to a directory of the run."""
    node.workerinput[WORKER_KEY] = engaged(node.config)
    if engaged(node.config):
        from attention_conformance.conformance import plugin as support

        support.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodeready(node):
    """pytest-xdist: a failure block names its test and its verdict; the worker's platform and interpreter line
    above each ("[gw0] linux -- Python 3.11.7 /path/python", from pytest's report, which caches it on the node)
    is one line of every block that says nothing about the implementation: left out under the suite."""
    if engaged(node.config):
        node._workerinfocache = ""


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist: a worker finished; merge its conformance records into the controller's."""
    if engaged(node.config):
        from attention_conformance.conformance import plugin as support

        support.receive_from_worker(node)

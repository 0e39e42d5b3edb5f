"""Repro files: a failure's case saved as ``ID.npz``, for ``attention-conformance repro ID``
(conformance/harness/replay.py) to replay.

A verdict (Judge.fail) carries its ``Evidence``: the implementation, dtype and device, the case that failed (its
inputs as float64 masters, its options, clauses, label, mask kind and notes), the judge class that gave the verdict
and, for a property test, the test function and the arguments it was called with (harness/properties.py adds them:
the drawn case, and the other drawn values such as a shift or a permutation seed). At the end of a failed test, in
the process that ran it (an xdist worker writes, its controller prints), the plugin saves each verdict's evidence
(``save``), whatever the size of its arrays, within the bound of its directory (conformance/judging/repro_files.py:
``--repro-max-files``, default 200 files, and ``--repro-max-bytes``, default 200 MB; earlier runs' files make room,
oldest first; past that, a new repro is not kept, and ``save`` raises NotKept saying why).

The ID is the first ID_LENGTH hex digits of a SHA-1 of the test id, implementation, device, dtype, clause and case
label: short, stable between runs (the same failing case of the same test overwrites its file) and distinct
between tests and cases. Files go beside the JSON report (``--conformance-report out/run.json``: ``out/run-repro/``,
emptied when a run starts), else under pytest's cache (``.pytest_cache/d/attention-conformance/repro/``), else
(``-p no:cacheprovider``) under ``.attention-conformance/repro/`` in the rootdir.

File format (numpy's compressed .npz, loaded without pickle): ``meta`` holds a JSON string (FORMAT, what is
above). Each array is stored once, by its content (``repro_files.array_hash``): a case's entry in ``meta`` maps each
input (``params.w_q`` for a dict of arrays) to its array's name; an array of up to SHARED_MIN_ELEMENTS elements lies
in the file as ``array/NAME``, a larger one in the directory's ``arrays/NAME.npz``, shared by every repro file that
holds it (``meta["shared"]`` lists them). The failed case and a Case the test was called with are mostly the same
arrays, and a covering corner fails in several tests and dtypes of a run: stored once. Format 1 (every array inline
as ``case/NAME`` and ``arg/KEYWORD/NAME``) is still read. Options (scale, is_causal, a window's tuple) are JSON,
tuples and non-finite floats tagged.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attention_conformance.conformance.judging import repro_files
from attention_conformance.conformance.judging.repro_files import DEFAULT_LIMITS, SHARED_MIN_ELEMENTS, Limits

FORMAT = 2


READABLE_FORMATS = (1, 2)


ID_LENGTH = 10


ID_PATTERN = re.compile(r"^[0-9a-f]{%d}$" % ID_LENGTH)


CACHE_SUBDIRECTORY = "attention-conformance"  # pytest's cache: .pytest_cache/d/attention-conformance/repro


FALLBACK_DIRECTORY = ".attention-conformance"  # under the rootdir, when pytest's cache is off


REPRO_SUBDIRECTORY = "repro"


DIRECTORY_KEY = "attention_conformance_repro"  # xdist workerinput: where the controller decided repros go


STARTED_KEY = "attention_conformance_repro_started"  # xdist workerinput: when the run started (time.time())


MAX_INLINE_ELEMENTS = SHARED_MIN_ELEMENTS  # --print-python inlines a case's arrays up to this many elements


SUITE_DIR = Path(__file__).resolve().parent.parent  # conformance/: the test modules


SUITE_PACKAGE = "attention_conformance.conformance"


# "started": when this run started (time.time()): repro files older than that are earlier runs', dropped first when
# the directory is full; 0.0 outside a run (no file is known to be older).
_STATE: dict = {"directory": None, "invocation": None, "config": None, "limits": DEFAULT_LIMITS, "started": 0.0}


class ReproError(Exception):
    """A repro that cannot be found, read or replayed (the command prints it and exits 2)."""


class NotKept(ReproError):
    """A repro the directory's bound left out (the failure block says why instead of printing a command)."""


# ------------------------------------------------------------------ what a verdict carries
@dataclass
class Evidence:
    """What a failure carries for its repro file: enough to call the implementation on the same case again."""

    id: str
    impl: Any  # implementations.Implementation
    dtype: str
    device: str
    clause: str
    case: Any  # cases.Case
    judge: str  # "module:Class" of the judge that gave the verdict
    test: str  # the pytest test id (PYTEST_CURRENT_TEST), or "" outside a test
    problem: str
    worst: str = ""
    # The property test's function and the keyword arguments of the failing call (properties.remember_call).
    call: tuple | None = field(default=None, repr=False)

    @classmethod
    def of(cls, judge, clause: str, case, problem: str, worst: str) -> "Evidence":
        test = judge.test_name
        return cls(id=repro_id(test, judge.impl.spec or judge.impl.name, judge.device, judge.dtype, clause, case.label),
                   impl=judge.impl, dtype=judge.dtype, device=judge.device, clause=clause, case=case,
                   judge=_qualified(type(judge)), test=test, problem=problem, worst=worst)


def repro_id(test: str, impl: str, device: str, dtype: str, clause: str, label: str) -> str:
    """ID_LENGTH hex digits naming one failing case of one test (stable between runs)."""
    text = "\0".join((test, impl, device, dtype, clause, label))
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:ID_LENGTH]


def remember_call(failure: BaseException, function, kwargs: dict) -> None:
    """Note on ``failure``'s evidence the property test and arguments it came from (the first noted wins: the
    innermost call, the one that failed)."""
    evidence = getattr(failure, "evidence", None)
    if evidence is not None and evidence.call is None:
        evidence.call = (function, dict(kwargs))


def _qualified(obj) -> str:
    """``module:qualname`` of a class or function, the module named as the installed suite names it (pytest
    imports a checkout's test modules as ``conformance.test_x``)."""
    module = obj.__module__
    found = sys.modules.get(module)
    source = getattr(found, "__file__", None)
    if source and Path(source).resolve().parent == SUITE_DIR:
        module = f"{SUITE_PACKAGE}.{Path(source).stem}"
    return f"{module}:{obj.__qualname__}"


def resolve(name: str):
    module, _, qualname = name.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# ------------------------------------------------------------------ where repros go
def report_directory(report_path: str | os.PathLike) -> Path:
    """The repro directory beside a JSON report: ``out/run.json`` (or ``.json.gz``) -> ``out/run-repro``."""
    path = Path(report_path)
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return path.with_name(f"{name}-repro")


def default_directories(base: Path) -> list[Path]:
    """The directories a bare ID is looked up in, from ``base`` (pytest's cache first)."""
    return [base / ".pytest_cache" / "d" / CACHE_SUBDIRECTORY / REPRO_SUBDIRECTORY,
            base / FALLBACK_DIRECTORY / REPRO_SUBDIRECTORY]


def configure(config) -> None:
    """Where this process saves repros (every process of a run: xdist workers take their controller's). Decided
    on first use: pytest's cache (config.cache) is set up after the suite's own pytest_configure."""
    invocation = Path(str(config.invocation_params.dir))
    worker = getattr(config, "workerinput", None)
    started = worker.get(STARTED_KEY) if worker is not None else None
    _STATE.update(directory=None, invocation=invocation, config=config, limits=limits(config),
                  started=float(started) if started is not None else time.time())
    report = config.getoption("conformance_report", None)
    if report and worker is None:
        repro_files.empty(report_directory(invocation / report))  # a report's repros are those of its run


def limits(config) -> Limits:
    """--repro-max-files and --repro-max-bytes (DEFAULT_LIMITS where the options are not registered)."""
    files = config.getoption("repro_max_files", None)
    size = config.getoption("repro_max_bytes", None)
    return Limits(DEFAULT_LIMITS.files if files is None else int(files),
                  DEFAULT_LIMITS.bytes if size is None else repro_files.parse_size(size))


def prune() -> None:
    """At the start of a run, in the controller (or the only process): this run's repro directory within its bound,
    earlier runs' files dropped oldest first (repro_files.prune)."""
    where = directory()
    if where is not None:
        repro_files.prune(where, _STATE["limits"], _STATE["started"])


def directory() -> Path | None:
    """This run's repro directory (module docstring); None outside a run of the suite."""
    if _STATE["directory"] is None and _STATE.get("config") is not None:
        config, invocation = _STATE["config"], _STATE["invocation"]
        worker = getattr(config, "workerinput", None)
        report = config.getoption("conformance_report", None)
        cache = getattr(config, "cache", None)
        if worker is not None and worker.get(DIRECTORY_KEY):
            where = Path(worker[DIRECTORY_KEY])
        elif report:
            where = report_directory(invocation / report)
        elif cache is not None:
            where = Path(cache.mkdir(CACHE_SUBDIRECTORY)) / REPRO_SUBDIRECTORY
        else:
            where = Path(str(config.rootpath)) / FALLBACK_DIRECTORY / REPRO_SUBDIRECTORY
        _STATE["directory"] = where.resolve()
    return _STATE["directory"]


def forget() -> None:
    """At the end of a run: the next run in this process (pytest.main) decides its directory again."""
    _STATE.update(directory=None, invocation=None, config=None, limits=DEFAULT_LIMITS, started=0.0)


def node_input(node) -> None:
    """pytest-xdist, on the controller: a worker saves its repros where the controller would."""
    where = directory()
    if where is not None:
        node.workerinput[DIRECTORY_KEY] = str(where)
    node.workerinput[STARTED_KEY] = _STATE["started"]


def command(repro: str) -> str:
    """The command line that replays repro ``repro`` (an ID) from the directory pytest ran in: the bare ID when it is
    found from there by default, else the path of its file."""
    where = directory()
    invocation = _STATE["invocation"] or Path.cwd()
    if where is None or any(where == d.resolve() for base in (invocation, *invocation.parents)
                            for d in default_directories(base)):
        return f"attention-conformance repro {repro}"
    path = where / f"{repro}.npz"
    try:
        path = path.relative_to(invocation.resolve())
    except ValueError:
        pass
    return f"attention-conformance repro {path}"


def find(reference: str, base: Path | None = None) -> Path:
    """The file of repro ``reference``: a path to an .npz, or an ID looked up in the default directories of
    ``base`` (the current directory) and its parents."""
    base = Path.cwd() if base is None else base
    given = Path(reference)
    if reference.endswith(".npz") or len(given.parts) > 1:
        path = given if given.is_absolute() else base / given
        if not path.suffix:
            path = path.with_suffix(".npz")
        if not path.is_file():
            raise ReproError(f"no repro file {path}")
        return path
    if not ID_PATTERN.match(reference):
        raise ReproError(f"{reference!r} is neither a repro ID ({ID_LENGTH} hex digits) nor a path to an .npz file")
    looked = []
    for parent in (base, *base.parents):
        for candidate in default_directories(parent):
            path = candidate / f"{reference}.npz"
            if path.is_file():
                return path
            looked.append(str(candidate))
    raise ReproError(f"no repro {reference} in {looked[0]} or {looked[1]} (nor above); a run with "
                     f"--conformance-report saves them beside the report: pass the path of the .npz")


# ------------------------------------------------------------------ writing
class _Unsaved(ReproError):
    """A value the format cannot hold (a Hypothesis data object, say): the call is not saved (the case, not at
    all)."""


def _option(value):
    """A case option or test argument as JSON, tagging what JSON would change."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple):
        return {"tuple": [_option(item) for item in value]}
    if isinstance(value, list):
        return [_option(item) for item in value]
    raise _Unsaved(f"{type(value).__name__} value")


def unoption(value):
    if isinstance(value, dict):
        if "tuple" in value:
            return tuple(unoption(item) for item in value["tuple"])
        if "float" in value:
            return float(value["float"])
        raise ReproError(f"unknown tagged value {value!r}")
    if isinstance(value, list):
        return [unoption(item) for item in value]
    return value


def _storable(array: np.ndarray) -> tuple[np.ndarray, str | None]:
    """(array numpy can save and load without pickle, the dtype name to cast back to or None)."""
    array = np.asarray(array)
    if array.dtype.kind in "biuf" and array.dtype.isbuiltin:
        return array, None
    return array.astype(np.float64), str(array.dtype)  # bfloat16 and other ml_dtypes: exact in float64


def _case_entry(case, arrays: dict) -> dict:
    """The case's description for ``meta``; its arrays go into ``arrays`` under their content's name."""
    options, names, cast, stored = {}, [], {}, {}
    for name, value in case.inputs.items():
        parts = value.items() if isinstance(value, dict) else [(None, value)]
        if isinstance(value, dict) or isinstance(value, np.ndarray):
            for key, item in parts:
                full = name if key is None else f"{name}.{key}"
                if not isinstance(item, np.ndarray):
                    raise _Unsaved(f"input {full} is a {type(item).__name__}, not an array")
                array, dtype = _storable(item)
                stored[full] = repro_files.array_hash(array)
                arrays.setdefault(stored[full], array)
                names.append(full)
                if dtype:
                    cast[full] = dtype
        else:
            options[name] = _option(value)
    return {"op": case.op, "label": case.label, "clauses": list(case.clauses), "mask_kind": case.mask_kind,
            "notes": {key: _option(value) for key, value in case.notes.items()}, "options": options,
            "arrays": names, "cast": cast, "stored": stored}


def _call_entry(call, arrays: dict) -> dict | None:
    """The property test and its arguments for ``meta`` (None when an argument cannot be saved)."""
    from attention_conformance.conformance.cases.case import Case
    from attention_conformance.implementations.registry import Implementation

    function, kwargs = call
    entry: dict = {"test": _qualified(function), "kwargs": {}}
    staged: dict = {}
    try:
        for name, value in kwargs.items():
            if isinstance(value, Implementation):
                entry["kwargs"][name] = {"implementation": True}
            elif isinstance(value, Case):
                entry["kwargs"][name] = {"case": _case_entry(value, staged)}
            else:
                entry["kwargs"][name] = _option(value)
    except _Unsaved:
        return None
    for name, array in staged.items():
        arrays.setdefault(name, array)
    return entry


def save(evidence: Evidence, where: Path | None = None) -> Path:
    """Write ``evidence`` as ``ID.npz`` in ``where`` (this run's directory), within the directory's bound; raises
    NotKept when the bound leaves it out."""
    where = directory() if where is None else where
    if where is None:
        raise ReproError("no repro directory: repro.configure has not run in this process")
    arrays: dict = {}
    meta = {
        "format": FORMAT, "id": evidence.id, "test": evidence.test,
        "implementation": {"name": evidence.impl.name, "spec": evidence.impl.spec},
        "dtype": evidence.dtype, "device": evidence.device, "clause": evidence.clause,
        "problem": evidence.problem, "worst": evidence.worst, "judge": evidence.judge,
        "case": _case_entry(evidence.case, arrays),
        "call": _call_entry(evidence.call, arrays) if evidence.call else None,
    }
    shared = {name: array for name, array in arrays.items() if array.size > SHARED_MIN_ELEMENTS}
    meta["shared"] = sorted(shared)
    inline = {f"array/{name}": array for name, array in arrays.items() if name not in shared}
    payload = repro_files.npz_bytes({"meta": np.array(json.dumps(meta)), **inline})
    why = repro_files.store(where, evidence.id, payload, shared, _STATE["limits"], _STATE["started"])
    if why:
        raise NotKept(why)
    return where / f"{evidence.id}.npz"


# ------------------------------------------------------------------ reading
def stored_array(path: Path, data, meta: dict, entry: dict, prefix: str, full: str) -> np.ndarray:
    """Input ``full`` of a case ``entry`` of the repro file ``path`` (``data``: its open .npz; ``prefix``: where format
    1 keeps the case's arrays, ``case`` or ``arg/KEYWORD``)."""
    if meta.get("format") == 1:
        return data[f"{prefix}/{full}"]
    name = entry["stored"][full]
    if f"array/{name}" in data.files:
        return data[f"array/{name}"]
    try:
        return repro_files.read_shared(path.parent, name)
    except FileNotFoundError:
        raise ReproError(f"{path}: its array {name} is not in {path.parent / repro_files.SHARED_DIRECTORY} (a repro "
                         f"file replays from its directory, or a copy of it with its arrays/)") from None

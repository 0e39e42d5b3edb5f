"""The repro directory, bounded: at most ``Limits.files`` repro files and ``Limits.bytes`` bytes, every large array
stored once.

conformance/judging/evidence.py decides what a repro holds and where it goes; this module keeps the directory:

* ``ID.npz``: one failure's file (its description and its small arrays, compressed);
* ``arrays/HASH.npz``: an array over SHARED_MIN_ELEMENTS elements, compressed, stored once for every repro file of
  the directory that holds it (a covering corner that fails in every dtype and test of a run is one file). A repro
  file is replayed from its directory, or from a copy of the directory with its ``arrays/``.

``store`` writes one repro file. When the directory would pass its bound, the repro files of earlier runs (written
before ``run_started``) go first, oldest first, with the shared arrays no kept file can refer to; when what is left
is this run's own files, the new repro is refused, and ``store`` says why (the failure block prints it instead of a
repro command: a block already printed never loses its file). ``prune`` brings a directory within its bound at the
start of a run. A lock file serialises the processes of a run (xdist workers) where the platform has ``fcntl``.

Which shared arrays a kept file refers to is known from modification times, without reading any file: an array is
touched after every repro file that refers to it is written, so an array older than the oldest kept repro file is
referred to by none.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHARED_DIRECTORY = "arrays"


SHARED_MIN_ELEMENTS = 4096  # larger arrays are stored once in arrays/ (--print-python inlines up to this many)


LOCK_NAME = ".lock"


ARRAY_KEY = "array"  # the one array of an arrays/HASH.npz


MEGABYTE = 10**6


@dataclass(frozen=True)
class Limits:
    """The bound of one repro directory: files (repro files) and bytes (repro files and shared arrays)."""

    files: int = 200
    bytes: int = 200 * MEGABYTE

    def describe(self) -> str:
        return f"--repro-max-files {self.files}, --repro-max-bytes {size_words(self.bytes)}"


DEFAULT_LIMITS = Limits()


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)[bB]?\s*$")


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_size(text: str | int) -> int:
    """Bytes from ``200MB``, ``1.5G``, ``500k`` or a plain number of bytes (decimal units)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size (a number of bytes, or with k, M or G: 200MB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def size_words(size: int) -> str:
    return f"{size / MEGABYTE:.3g} MB" if size >= MEGABYTE else f"{size / 10**3:.3g} kB"


def array_hash(array: np.ndarray) -> str:
    """A name for an array's content: its dtype, shape and bytes (equal arrays, one name)."""
    import hashlib

    digest = hashlib.sha1(f"{array.dtype.str}{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()[:20]


def shared_path(directory: Path, name: str) -> Path:
    return directory / SHARED_DIRECTORY / f"{name}.npz"


def npz_bytes(arrays: dict) -> bytes:
    """``arrays`` as a compressed .npz, in memory (its size decides whether it fits before anything is written)."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


# ------------------------------------------------------------------ what a directory holds
@dataclass
class _Entry:
    path: Path
    size: int
    mtime: float


def _entries(directory: Path, pattern: re.Pattern) -> list[_Entry]:
    found = []
    try:
        with os.scandir(directory) as listing:
            for item in listing:
                if pattern.match(item.name):
                    try:
                        stat = item.stat()
                    except OSError:
                        continue  # removed meanwhile
                    found.append(_Entry(Path(item.path), stat.st_size, stat.st_mtime))
    except FileNotFoundError:
        pass
    return sorted(found, key=lambda entry: entry.mtime)


HEX_NAME = re.compile(r"^[0-9a-f]+\.npz$")  # a repro file (ID.npz), or a shared array (HASH.npz) in arrays/


PARTIAL_NAME = re.compile(r"^\..*\.partial\.npz$")


@dataclass
class _Contents:
    repros: list[_Entry]  # oldest first
    shared: list[_Entry]  # oldest first

    @property
    def bytes(self) -> int:
        return sum(entry.size for entry in self.repros) + sum(entry.size for entry in self.shared)


def _contents(directory: Path) -> _Contents:
    return _Contents(_entries(directory, HEX_NAME), _entries(directory / SHARED_DIRECTORY, HEX_NAME))


def _drop(entry: _Entry) -> None:
    with contextlib.suppress(OSError):
        entry.path.unlink()


def _drop_unreferenced(contents: _Contents) -> None:
    """Drop the shared arrays older than the oldest repro file left (none of them refers to one)."""
    oldest = contents.repros[0].mtime if contents.repros else float("inf")
    kept = []
    for entry in contents.shared:
        (kept.append if entry.mtime >= oldest else _drop)(entry)
    contents.shared = kept


def _make_room(contents: _Contents, limits: Limits, run_started: float, files: int, size: int,
               replaced: Path | None = None) -> bool:
    """Drop earlier runs' repro files, oldest first, and the shared arrays they alone held, until ``files`` more
    repro files of ``size`` bytes fit (``replaced``: a file the new one overwrites, its room freed). Whether they
    fit."""
    def fits() -> bool:
        overwritten = [entry for entry in contents.repros if entry.path == replaced]
        count = len(contents.repros) - len(overwritten) + files
        return count <= limits.files and contents.bytes - sum(e.size for e in overwritten) + size <= limits.bytes

    while not fits():
        old = next((entry for entry in contents.repros if entry.mtime < run_started and entry.path != replaced), None)
        if old is None:
            return False
        contents.repros.remove(old)
        _drop(old)
        _drop_unreferenced(contents)
    return True


@contextlib.contextmanager
def _locked(directory: Path):
    """The directory to one process of the run at a time (no lock where the platform has no fcntl)."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(directory / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------ keeping the bound
def prune(directory: Path, limits: Limits, run_started: float) -> None:
    """Bring ``directory`` within ``limits`` by dropping earlier runs' repro files, oldest first (the start of a
    run); leftovers of a writer that died (``.*.partial.npz``) from before ``run_started`` go too."""
    if not directory.is_dir():
        return
    with _locked(directory):
        for entry in _entries(directory, PARTIAL_NAME) + _entries(directory / SHARED_DIRECTORY, PARTIAL_NAME):
            if entry.mtime < run_started:
                _drop(entry)
        contents = _contents(directory)
        _drop_unreferenced(contents)
        _make_room(contents, limits, run_started, 0, 0)


def store(directory: Path, repro_id: str, payload: bytes, shared: dict[str, np.ndarray], limits: Limits,
          run_started: float) -> str | None:
    """Write the repro file ``ID.npz`` (``payload``) and the ``shared`` arrays it refers to that the directory lacks,
    within ``limits``. Returns None when written, else why the repro was not kept."""
    target = directory / f"{repro_id}.npz"
    with _locked(directory):
        missing = {name: npz_bytes({ARRAY_KEY: array}) for name, array in shared.items()
                   if not shared_path(directory, name).is_file()}
        size = len(payload) + sum(len(data) for data in missing.values())
        if size > limits.bytes:
            return f"its {size_words(size)} exceed --repro-max-bytes {size_words(limits.bytes)}"
        contents = _contents(directory)
        if not _make_room(contents, limits, run_started, 1, size, replaced=target):
            return (f"this run's repro files fill the directory's bound ({limits.describe()}; "
                    f"{len(contents.repros)} files, {size_words(contents.bytes)})")
        for name, data in missing.items():
            _write(shared_path(directory, name), data)
        _write(target, payload)
        now = time.time()
        for name in shared:  # after the file that refers to them (module docstring)
            with contextlib.suppress(OSError):
                os.utime(shared_path(directory, name), (now, now))
    return None


def _write(path: Path, data: bytes) -> None:
    """Through a temporary file: a reader never sees half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.stem}.{os.getpid()}.partial.npz")
    partial.write_bytes(data)
    os.replace(partial, path)


def empty(directory: Path) -> None:
    """Remove the repro files and shared arrays of ``directory`` (a report's, when its run starts)."""
    contents = _contents(directory)
    for entry in contents.repros + contents.shared:
        _drop(entry)


def read_shared(directory: Path, name: str) -> np.ndarray:
    """A shared array of the repro directory ``directory``; FileNotFoundError when it is gone."""
    with np.load(shared_path(directory, name), allow_pickle=False) as data:
        return data[ARRAY_KEY]

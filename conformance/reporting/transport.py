"""What an xdist worker hands its controller: case records, kept fixture outputs, versions and devices.

Two ways, so that a run stopped from outside loses nothing judged:

* after each test item, the worker appends what it judged since the last item to its own file in a directory of
  the run (``stream``: JSON lines, one record, output (its float64 bytes in base64) or environment per line);
* at its end, it says in ``workeroutput`` how many records its complete stream holds (``send_to_controller``), and
  the controller reads that file when the worker goes down (``receive_from_worker``, pytest_testnodedown). Only a
  worker whose stream could not be written sends everything in ``workeroutput`` itself: execnet's pure-Python
  serialiser took 3 to 7 s at the end of each worker of a default run for what the file already held;
* a worker that dies or is interrupted without delivering its ``workeroutput`` (SIGTERM to the run, a crash, a CI
  timeout) leaves its file, and the controller reads the files of the workers it has not heard from
  (``read_unreceived``) before it writes the summary and the report.

The controller names the directory (``open_stream_directory``, a fresh temporary directory per run) in each
worker's ``workerinput`` and removes it at the end.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np

from attention_conformance.conformance.judging import agreement
from attention_conformance.conformance.judging.records import RECORDS, CaseRecord
from attention_conformance.conformance.reporting import environment

STREAM_KEY = "attention_conformance_stream"  # workerinput: the directory of the run's streams


RECEIVED: set[str] = set()  # the workers whose workeroutput the controller merged (by worker id)


_DIRECTORY: dict = {"path": None}  # the controller's stream directory


_WRITER: dict = {"records": 0, "outputs": 0, "environment": None, "failed": False}  # what a worker's stream has so far


def is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _worker_id(config) -> str:
    return str(config.workerinput.get("workerid", os.getpid()))


# ------------------------------------------------------------------ the worker's side
def announce(config) -> None:
    """At the worker's start: its process id beside its stream, for the controller to stop it (stop_workers)."""
    directory = config.workerinput.get(STREAM_KEY) if is_xdist_worker(config) else None
    _WRITER.update(records=0, outputs=len(agreement.KEPT), environment=None, failed=False)
    if directory:
        try:
            (Path(directory) / f"{_worker_id(config)}.pid").write_text(str(os.getpid()))
        except OSError:
            pass


def _new_outputs():
    """(dtype, case, name, values) of the fixture outputs kept since the last call (agreement.KEPT from where the
    stream got to; scanning every kept output after each item was quadratic in the fixtures: 0.6 s a worker)."""
    kept, start = agreement.KEPT, min(_WRITER["outputs"], len(agreement.KEPT))
    _WRITER["outputs"] = len(kept)
    for key, name in kept[start:]:
        out = agreement._OUTPUTS.get(key, {}).get(name)
        if out is not None:  # None: a self-check put the kept outputs back
            yield key[0], key[1], name, out


def stream(config, final: bool = False) -> None:
    """Append to this worker's stream what it judged since the last call (after each test item; ``final``: at the
    worker's end, with its environment). Each line is flushed, so a worker killed a moment later leaves it."""
    directory = config.workerinput.get(STREAM_KEY) if is_xdist_worker(config) else None
    if not directory:
        return
    records = RECORDS
    if len(records) < _WRITER["records"]:  # a self-check put back fewer records than were streamed
        _WRITER["failed"] = True  # the stream no longer mirrors RECORDS: workeroutput carries them at the end
    start = min(_WRITER["records"], len(records))
    lines = [json.dumps({"record": rec.transport()}, default=float) for rec in records[start:]]
    _WRITER["records"] = len(records)
    for dtype, case, name, out in _new_outputs():
        lines.append(json.dumps({"output": [dtype, case, name, _encoded(out)]}))
    if final or _WRITER["environment"] is None:
        env = environment.local_environment()
        if env != _WRITER["environment"]:
            _WRITER["environment"] = env
            lines.append(json.dumps({"environment": env}))
    if not lines:
        return
    path = Path(directory) / f"{_worker_id(config)}.jsonl"
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
            handle.flush()
    except OSError:
        _WRITER["failed"] = True  # the controller removed the directory (it is finishing): workeroutput carries all


def send_to_controller(config) -> None:
    """At the worker's end, after its final ``stream``: the number of records its stream holds, or, where the stream
    could not be written, its case records, kept outputs, versions and devices themselves, in workeroutput."""
    streamed = getattr(config, "workerinput", {}).get(STREAM_KEY)
    if streamed and not _WRITER["failed"] and _WRITER["records"] == len(RECORDS):
        config.workeroutput["conformance_streamed"] = _WRITER["records"]
        return
    config.workeroutput["conformance_records"] = [rec.transport() for rec in RECORDS]
    config.workeroutput["conformance_environment"] = environment.local_environment()
    config.workeroutput["conformance_outputs"] = [
        [dtype, case, name, _encoded(out)]
        for (dtype, case), outputs in agreement._OUTPUTS.items()
        for name, out in outputs.items()
    ]


# ------------------------------------------------------------------ the controller's side
def open_stream_directory() -> str:
    """The run's stream directory (made on the first call), for each worker's workerinput."""
    if _DIRECTORY["path"] is None:
        RECEIVED.clear()  # a new run (pytest.main may run several in one process)
        _DIRECTORY["path"] = tempfile.mkdtemp(prefix="attention-conformance-run-")
    return _DIRECTORY["path"]


def _encoded(array) -> dict:
    """A kept output as its float64 bytes in base64 and its shape: a fixture's output can hold 10^5 values, and as
    JSON numbers they were most of a stream (9.1 of 9.8 MB) and 1.5 s of the controller's decoding at the end."""
    values = np.ascontiguousarray(array, dtype=np.float64)
    return {"shape": list(values.shape), "float64": base64.b64encode(values.tobytes()).decode("ascii")}


def _decoded(data: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data["float64"]), dtype=np.float64).reshape(data["shape"]).copy()


def _merge(records, env, outputs) -> None:
    RECORDS.extend(CaseRecord.from_transport(data) for data in records)
    environment.merge_worker_environment(env or {})
    for dtype, case, name, values in outputs:
        agreement._OUTPUTS[(dtype, case)][name] = _decoded(values)


def receive_from_worker(node) -> None:
    """The controller merges what a finished worker sent, once per worker (xdist may report a worker down twice)."""
    output = getattr(node, "workeroutput", None) or {}
    if "conformance_records" not in output and "conformance_streamed" not in output:
        return  # it died before sending: read_unreceived reads its stream instead
    worker = str(node.workerinput.get("workerid", id(node))) if hasattr(node, "workerinput") else str(id(node))
    if worker in RECEIVED:
        return
    if "conformance_streamed" in output:
        path = Path(_DIRECTORY["path"] or "") / f"{worker}.jsonl"
        records, env, outputs = _read_stream(path) if path.is_file() else ([], {}, [])
        if len(records) != output["conformance_streamed"]:
            raise RuntimeError(f"xdist worker {worker} streamed {output['conformance_streamed']} case records to "
                               f"{path}, the controller read {len(records)}")
    else:
        records, env, outputs = (output.get("conformance_records", []), output.get("conformance_environment"),
                                 output.get("conformance_outputs", []))
    RECEIVED.add(worker)
    _merge(records, env, outputs)


def _read_stream(path: Path) -> tuple[list, dict, list]:
    """A worker's stream: (records, environment, outputs); a line cut short by the worker's death is skipped."""
    records, outputs, env = [], [], {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if "record" in entry:
                records.append(entry["record"])
            elif "output" in entry:
                outputs.append(entry["output"])
            elif "environment" in entry:
                env = entry["environment"]
    return records, env, outputs


def read_unreceived() -> dict[str, int]:
    """Merge the streams of the workers whose workeroutput never arrived; returns {worker id: records read}."""
    directory = _DIRECTORY["path"]
    read: dict[str, int] = {}
    if not directory or not os.path.isdir(directory):
        return read
    for path in sorted(Path(directory).glob("*.jsonl")):
        worker = path.stem
        if worker in RECEIVED:
            continue
        records, env, outputs = _read_stream(path)
        RECEIVED.add(worker)
        _merge(records, env, outputs)
        read[worker] = len(records)
    return read


def _is_my_child(pid: int) -> bool:
    """Whether ``pid`` is a live child of this process (where /proc says; elsewhere, whether it is alive)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        if stat.exists():
            return int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
        os.kill(pid, 0)
        return True
    except (OSError, ValueError, IndexError):
        return False


def stop_workers() -> list[str]:
    """The controller was interrupted: SIGTERM each worker it has not heard from, so that it stops at once, streams
    what it judged and exits (xdist would otherwise wait 10 s for a busy worker, then kill it). Returns their ids.

    A worker stopped this way ends its session as interrupted (conformance/harness/session.py), as under `timeout`,
    which
    signals the whole process group."""
    directory = _DIRECTORY["path"]
    if not directory or not os.path.isdir(directory) or not hasattr(signal, "SIGTERM"):
        return []
    stopped = []
    for path in sorted(Path(directory).glob("*.pid")):
        if path.stem in RECEIVED:
            continue
        try:
            pid = int(path.read_text())
        except (OSError, ValueError):
            continue
        if _is_my_child(pid):
            try:
                os.kill(pid, signal.SIGTERM)
                stopped.append(path.stem)
            except OSError:
                pass
    return stopped


def close_stream_directory() -> None:
    directory, _DIRECTORY["path"] = _DIRECTORY["path"], None
    if directory:
        shutil.rmtree(directory, ignore_errors=True)

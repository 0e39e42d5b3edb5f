"""The processes a sequence-parallel case runs on, owned by the test process: a pool of torch.distributed ranks
and a JAX child holding host devices. One of each per process (per pytest-xdist worker), started on the first case
that needs it and reused by every later one, closed at the end of the session (``close_all``; the test module's
session fixture calls it, and atexit does outside pytest).

- ``RankPool``: LARGEST_WORLD ranks joined in one gloo group (``file://`` rendezvous in a fresh directory, so that
  xdist workers never share a port), forked from a forkserver that has imported torch already (a new rank then
  costs a fork, not an import of torch: 0.1-0.4 s for eight instead of 2-10 s). Each rank makes the sub-groups of
  the first n ranks at start, so a case of N devices runs on the first N ranks. Each rank is the leader of its own
  process group (killed with everything it started at once) and leaves when the owner is gone.
- ``JaxChild``: a spawned process (never a fork of a process running XLA's threads) that sets XLA_FLAGS to
  HOST_DEVICES host devices before it imports JAX: the test process has JAX with one device already, and the
  device count is fixed when JAX's backend starts. It also contains a collective that not every device joins,
  which XLA:CPU ends by aborting the whole process after about 60 s.

A case that does not finish by its deadline (a hung rank or collective, a rank that died or raised while its
peers wait for it) kills the group or the child: ``GroupFailure`` names the ranks that did not answer and what
the others said, and the next case starts a fresh one. Any failure ends the group, because a half-run case may
leave messages in flight that a later case would receive.
"""
from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import wait

from attention_conformance.conformance.harness import sequence_parallel_ranks as ranks
from attention_conformance.implementations.sequence_parallel import LARGEST_WORLD

START_TIMEOUT_S = 120.0  # forkserver and torch import, or JAX's, on a loaded machine


# After one rank failed, its peers are probably waiting for it: the others get this long to answer.
GRACE_AFTER_FAILURE_S = 1.0


class GroupFailure(Exception):
    """A case whose processes did not all answer: ``missing`` the ranks that did not, ``replies`` what the others
    said ({rank: (status, payload)}), ``waited`` the seconds waited, ``hung`` whether the deadline passed."""

    def __init__(self, message: str, missing: list[int], replies: dict, waited: float, hung: bool):
        self.missing, self.replies, self.waited, self.hung = missing, replies, waited, hung
        super().__init__(message)


class StartFailure(RuntimeError):
    """The rank pool or the JAX child did not start: an error of the machine or the suite, never a verdict on an
    implementation (the test errors with it)."""


def _paths() -> list[str]:
    """The owner's import path (and its working directory): a user's implementation loads the same in a rank."""
    return [os.getcwd(), *sys.path]


def _collect(connections: dict, deadline: float) -> dict:
    """Replies {rank: (status, payload)} until every rank in ``connections`` ({rank: pipe}) answered, or the
    deadline (time.monotonic()) passed; after a failure the deadline moves to GRACE_AFTER_FAILURE_S from then."""
    replies: dict = {}
    waiting = {conn: rank for rank, conn in connections.items()}
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for conn in wait(list(waiting), timeout=left):
            rank = waiting.pop(conn)
            try:
                status, _, payload = conn.recv()
            except (EOFError, OSError):
                status, payload = "died", "the process exited"
            replies[rank] = (status, payload)
            if status not in ("ok", "ready"):
                deadline = min(deadline, time.monotonic() + GRACE_AFTER_FAILURE_S)
    return replies


def _kill(process) -> None:
    """SIGKILL ``process`` and its process group, and reap it."""
    for killer in (lambda: os.killpg(process.pid, signal.SIGKILL), process.kill):
        try:
            killer()
        except (ProcessLookupError, PermissionError, OSError, ValueError):
            pass
    process.join(5)


class RankPool:
    """LARGEST_WORLD torch.distributed ranks on the CPU (gloo), reused case after case (module docstring)."""

    PRELOAD = ["torch", "torch.distributed", "numpy", "attention_conformance.conformance.harness."
               "sequence_parallel_ranks", "attention_conformance.implementations.registry"]

    def __init__(self, world: int = LARGEST_WORLD, backend: str = "gloo"):
        self.world, self.backend = world, backend
        self.processes: list | None = None
        self.connections: list | None = None
        self.directory: str | None = None
        self.starts = 0  # how many times the group was started (once per process, unless a case failed)

    @property
    def alive(self) -> bool:
        return self.processes is not None

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes or []]

    def start(self) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(self.PRELOAD)
        self.directory = tempfile.mkdtemp(prefix="attention-conformance-ranks-")
        init = "file://" + os.path.join(self.directory, "rendezvous")
        self.processes, self.connections = [], []
        for rank in range(self.world):
            mine, theirs = context.Pipe()
            process = context.Process(target=ranks.rank_main, name=f"sequence-parallel-rank-{rank}", daemon=True,
                                      args=(rank, self.world, init, theirs, os.getpid(), _paths(), self.backend))
            process.start()
            theirs.close()
            self.processes.append(process)
            self.connections.append(mine)
        started = time.monotonic()
        replies = _collect(dict(enumerate(self.connections)), started + START_TIMEOUT_S)
        missing = [r for r in range(self.world) if replies.get(r, ("",))[0] != "ready"]
        if missing:
            self.kill()
            raise StartFailure(f"ranks {missing} of a new torch.distributed group ({self.backend}) did not start "
                               f"within {START_TIMEOUT_S:g} s: {replies}")
        self.starts += 1

    def run(self, messages: list[dict], deadline_s: float, label: str) -> list[dict]:
        """Send message r to rank r (r < len(messages)) and return their payloads, in rank order. Raises
        GroupFailure, the group killed, unless every rank answered "ok" by the deadline."""
        if not self.alive:
            self.start()
        started = time.monotonic()
        connections, dead = {}, {}
        finished = False
        try:
            for rank, message in enumerate(messages):
                try:
                    self.connections[rank].send(message)
                    connections[rank] = self.connections[rank]
                except OSError:  # the rank is gone since the last case
                    dead[rank] = ("died", "the process had exited before the case")
            replies = {**_collect(connections, started + deadline_s), **dead}
            finished = all(replies.get(r, ("",))[0] == "ok" for r in range(len(messages)))
        finally:
            if not finished:  # also when the per-test limit interrupted the wait: a half-run case ends the group
                self.kill()
        if finished:
            return [replies[r][1] for r in range(len(messages))]
        return self._failure(replies, len(messages), time.monotonic() - started, deadline_s, label)

    @staticmethod
    def _failure(replies: dict, members: int, waited: float, deadline_s: float, label: str):
        missing = [r for r in range(members) if r not in replies]
        hung = bool(missing) and waited >= deadline_s
        said = "; ".join(f"rank {r} {status}: {str(payload).splitlines()[0][:300]}"
                         for r, (status, payload) in sorted(replies.items()) if status != "ok")
        text = f"case {label}: "
        if missing:
            text += f"rank(s) {missing} of {members} did not answer within {waited:.1f} s"
            text += " (hung in a collective?)" if hung else ""
        text += ("; " if missing and said else "") + said
        raise GroupFailure(text + "; the group was killed, the next case starts a fresh one", missing, replies,
                           waited, hung)

    def kill(self) -> None:
        for process in self.processes or []:
            _kill(process)
        for conn in self.connections or []:
            conn.close()
        self.processes = self.connections = None
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def close(self) -> None:
        """Ask every rank to leave, then make sure they have."""
        for conn in self.connections or []:
            try:
                conn.send(None)
            except OSError:
                pass
        for process in self.processes or []:
            process.join(2)
        self.kill()


class JaxChild:
    """The JAX process with HOST_DEVICES host devices, reused case after case (module docstring)."""

    def __init__(self):
        self.process = None
        self.connection = None
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self.process is not None

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=ranks.jax_main, name="sequence-parallel-jax", daemon=True,
                                       args=(theirs, os.getpid(), _paths()))
        self.process.start()
        theirs.close()
        started = time.monotonic()
        replies = _collect({0: self.connection}, started + START_TIMEOUT_S)
        if replies.get(0, ("",))[0] != "ready":
            self.kill()
            raise StartFailure(f"the JAX child ({ranks.HOST_DEVICES} host devices) did not start within "
                               f"{START_TIMEOUT_S:g} s: {replies}")
        self.starts += 1

    def run(self, message: dict, deadline_s: float, label: str) -> dict:
        """The child's payload for ``message``; raises GroupFailure, the child killed, unless it answered "ok"."""
        if not self.alive:
            self.start()
        started = time.monotonic()
        replies, finished = {}, False
        try:
            try:
                self.connection.send(message)
                replies = _collect({0: self.connection}, started + deadline_s)
            except OSError:
                replies = {0: ("died", "the JAX child had exited before the case")}
            finished = replies.get(0, ("",))[0] == "ok"
        finally:
            if not finished:
                self.kill()
        if finished:
            return replies[0][1]
        waited = time.monotonic() - started
        if 0 not in replies:
            raise GroupFailure(f"case {label}: the JAX child (devices 0..{message['size'] - 1}) did not answer "
                               f"within {waited:.1f} s (a hung collective?); it was killed, the next case starts a "
                               "fresh one", list(range(message["size"])), {}, waited, True)
        status, payload = replies[0]
        raise GroupFailure(f"case {label}: the JAX child {status}: {payload}", [], replies, waited, False)

    def kill(self) -> None:
        if self.process is not None:
            _kill(self.process)
            self.connection.close()
        self.process = self.connection = None

    def close(self) -> None:
        if self.process is not None:
            try:
                self.connection.send(None)
            except OSError:
                pass
            self.process.join(2)
        self.kill()


_OWNED: dict = {}


def rank_pool() -> RankPool:
    """This process's pool of torch ranks (made on first use; started on its first case)."""
    if "torch" not in _OWNED:
        _OWNED["torch"] = RankPool()
    return _OWNED["torch"]


def jax_child() -> JaxChild:
    """This process's JAX child (made on first use; started on its first case)."""
    if "jax" not in _OWNED:
        _OWNED["jax"] = JaxChild()
    return _OWNED["jax"]


def starts() -> dict[str, int]:
    """How often this process started its rank pool and its JAX child (each once, unless a case failed)."""
    return {kind: owned.starts for kind, owned in _OWNED.items()}


def owned_pids() -> list[int]:
    return [pid for owned in _OWNED.values() for pid in owned.pids()]


# A file to which close_all appends one line per process, {"pid": ..., "torch": starts, "jax": starts}: how the
# self-checks see that each xdist worker started its processes once.
START_LOG_VARIABLE = "ATTENTION_CONFORMANCE_PROCESS_GROUP_LOG"


def close_all() -> None:
    """Close the rank pool and the JAX child, and stop the forkserver the ranks came from."""
    log = os.environ.get(START_LOG_VARIABLE)
    if log and _OWNED:
        with open(log, "a", encoding="utf-8") as out:
            out.write(json.dumps({"pid": os.getpid(), **starts()}) + "\n")
    for owned in _OWNED.values():
        owned.close()
    _OWNED.clear()
    forkserver = sys.modules.get("multiprocessing.forkserver")
    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid and hasattr(server, "_stop"):
        # Killed first: left to exit on its own it finalizes the torch it imported, 1.5 s at the end of every worker;
        # it has nothing to save and no child left.
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server._stop()  # reaps it and forgets it: a later pool starts a new one


atexit.register(close_all)

"""What runs inside the processes of a sequence-parallel case: a torch.distributed rank, and the JAX child that owns
the host devices (conformance/harness/process_groups.py starts them and talks to them through a pipe).

A case reaches them as a message of NumPy arrays (already rounded to the case's dtype) and the call's keywords; the
implementation is loaded again in the process from its spec (``builtin:NAME`` or ``module[:attr]``) and cached. A
torch rank gets its own shards and calls ``sdpa_sequence_parallel(q, k, v, group=..., ...)``; the JAX child gets the
global arrays in rank order (every rank's shard after the previous one's) and calls it inside ``shard_map`` over
the first N host devices, one jitted program per (implementation, N, options), jit caching the shapes. Both reply
with what the implementation returned, checked against the contract's form (an array, or (out, lse) with
``return_lse``), widened to float64, and its gradients where asked: those of sum(out * d_out) + sum(lse * d_lse)
(a row whose lse is -inf takes d_lse 0).

Every reply is ``(status, rank, payload)``: "ok" (a result), "unsupported" (the implementation raised
NotImplementedError) or "raised" (any other exception; the payload is its text and where it was raised). Frameworks
are imported here only (this module imports neither at load).
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import time
import traceback

import numpy as np

# The mesh axis the JAX child's shard_map names (the implementation's axis_name).
AXIS_NAME = "sequence"


# JAX host devices of the child: the largest N the suite draws (implementations/sequence_parallel.py).
HOST_DEVICES = 8


class ContractBreach(Exception):
    """The result is not of the contract's form (the parent files it under contract.result-type)."""


def _watch_owner(owner_pid: int) -> None:
    """Exit when the owner is gone, even while stuck in a collective: nothing outlives the test process."""

    def watch():
        while True:
            time.sleep(0.5)
            try:
                os.kill(owner_pid, 0)
            except ProcessLookupError:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="owner-watch").start()


def _load(spec: str, cache: dict):
    if spec not in cache:
        from attention_conformance.implementations.registry import load_implementation

        cache[spec] = load_implementation(spec)
    return cache[spec]


def _reply_for(call) -> tuple[str, dict | str]:
    """Run ``call()``, returning ("ok", its payload) or the implementation's exception as a status."""
    try:
        return "ok", call()
    except NotImplementedError as exc:
        return "unsupported", f"NotImplementedError: {exc}"
    except ContractBreach as exc:
        return "contract", str(exc)
    except Exception as exc:  # noqa: BLE001 -- the implementation's own exception: the parent's verdict
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        return "raised", f"{type(exc).__name__}: {exc}{where}"


def _serve(conn, rank: int, case) -> None:
    """Say ready, then answer each case message with ``case(message)``'s reply until the owner sends None or hangs up."""
    conn.send(("ready", rank, None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:
            break
        status, payload = _reply_for(functools.partial(case, message))
        conn.send((status, rank, payload))


def _described(value) -> str:
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def split_result(result, return_lse: bool, is_array) -> tuple:
    """(out, lse or None) of what the implementation returned, or ContractBreach saying what it returned."""
    if return_lse:
        if not (isinstance(result, (tuple, list)) and len(result) == 2 and all(map(is_array, result))):
            raise ContractBreach(f"with return_lse=True it returned {_described(result)}, expected (out, lse): two "
                                 "arrays")
        return result[0], result[1]
    if not is_array(result):
        raise ContractBreach(f"returned {_described(result)}, expected an array (the output's shard)")
    return result, None


# ------------------------------------------------------------------ a torch rank
def rank_main(rank: int, world: int, init_method: str, conn, owner_pid: int, paths: list[str], backend: str) -> None:
    """A torch.distributed rank of the pool: join the group, make the sub-groups of the first n ranks (n = 2 ..
    world), then run cases until told to stop."""
    os.setsid()  # its own process group: the owner kills it and anything it started at once
    _watch_owner(owner_pid)
    sys.path[:0] = [p for p in paths if p not in sys.path]
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # The owner's deadline is what counts: gloo's own timeout only ends a rank the owner no longer waits for.
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    groups = {n: dist.new_group(list(range(n))) for n in range(2, world)}
    groups[world] = dist.group.WORLD
    implementations: dict = {}
    _serve(conn, rank, lambda message: _torch_case(message, groups[message["size"]], implementations))
    os._exit(0)  # not destroy_process_group: a peer may be gone already


def _torch_case(message: dict, group, implementations: dict) -> dict:
    import torch

    from attention_conformance.implementations.arrays import ARRAY_KINDS

    kind = ARRAY_KINDS["torch"]
    impl = _load(message["spec"], implementations)
    arrays = message["arrays"]
    gradients = message["gradients"]
    primals = {name: kind.to_native(arrays[name], "cpu") for name in ("q", "k", "v", "learnable_sink")
               if arrays.get(name) is not None}
    if gradients:
        primals = {name: value.requires_grad_(True) for name, value in primals.items()}
    keywords = dict(message["keywords"])
    if "learnable_sink" in primals:
        keywords["learnable_sink"] = primals["learnable_sink"]
    result = impl.operation("sdpa_sequence_parallel")(primals["q"], primals["k"], primals["v"], group=group,
                                                        **keywords)
    out, lse = split_result(result, message["return_lse"], lambda x: isinstance(x, torch.Tensor))
    reply = {"out": out.detach().to(torch.float64).numpy(), "out_dtype": str(out.dtype).replace("torch.", ""),
             "lse": None if lse is None else lse.detach().to(torch.float64).numpy(),
             "lse_dtype": None if lse is None else str(lse.dtype).replace("torch.", "")}
    if gradients:
        d_out = torch.from_numpy(np.asarray(arrays["d_out"], dtype=np.float64))
        loss = (out.to(torch.float64) * d_out).sum()
        if lse is not None and arrays.get("d_lse") is not None:
            d_lse = torch.from_numpy(np.asarray(arrays["d_lse"], dtype=np.float64))
            loss = loss + torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)).to(torch.float64).mul(
                d_lse).sum()
        names = list(primals)
        found = torch.autograd.grad(loss, [primals[n] for n in names], allow_unused=True)
        for name, grad in zip(names, found):
            reply[GRADIENT_NAMES[name]] = None if grad is None else grad.detach().to(torch.float64).numpy()
    return reply


GRADIENT_NAMES = {"q": "dq", "k": "dk", "v": "dv", "learnable_sink": "dsink"}


# ------------------------------------------------------------------ the JAX child
def jax_main(conn, owner_pid: int, paths: list[str]) -> None:
    """The JAX child: HOST_DEVICES host devices (set before JAX starts), then cases until told to stop."""
    _watch_owner(owner_pid)
    sys.path[:0] = [p for p in paths if p not in sys.path]
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={HOST_DEVICES}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.devices()
    implementations: dict = {}
    programs: dict = {}
    _serve(conn, 0, lambda message: _jax_case(message, implementations, programs))
    os._exit(0)


def _jax_program(impl, message: dict, programs: dict):
    """The jitted shard_map program of the case's implementation, N and options (cached): it takes the global
    arrays in rank order and, for a gradient case, the cotangents too, returning the output and the gradients."""
    has_sink = message["arrays"].get("learnable_sink") is not None
    key = (impl.spec, message["size"], tuple(sorted(message["keywords"].items())), has_sink, message["return_lse"],
           message["gradients"], message["check_vma"], message["dtype"])
    if key in programs:
        return programs[key]
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:message["size"]]), (AXIS_NAME,))
    sequence = P(None, None, AXIS_NAME, None)
    rows = P(None, None, AXIS_NAME)
    operation = impl.operation("sdpa_sequence_parallel")
    keywords, return_lse = dict(message["keywords"]), message["return_lse"]

    def body(q, k, v, *sink):
        extra = dict(keywords, learnable_sink=sink[0]) if sink else keywords
        return operation(q, k, v, axis_name=AXIS_NAME, **extra)

    sharded = jax.shard_map(body, mesh=mesh, in_specs=(sequence,) * 3 + ((P(),) if has_sink else ()),
                            out_specs=(sequence, rows) if return_lse else sequence, check_vma=message["check_vma"])
    if not message["gradients"]:
        program = jax.jit(sharded)
    else:
        def forward_and_back(primals, d_out, d_lse):
            result, pullback = jax.vjp(sharded, *primals)
            if return_lse:
                out, lse = result
                cotangent = (d_out.astype(out.dtype), jnp.where(jnp.isfinite(lse), d_lse, 0).astype(lse.dtype))
            else:
                cotangent = d_out.astype(result.dtype)
            return result, pullback(cotangent)

        program = jax.jit(forward_and_back)
    programs[key] = program
    return program


def _jax_case(message: dict, implementations: dict, programs: dict) -> dict:
    import jax

    from attention_conformance.implementations.arrays import ARRAY_KINDS

    impl = _load(message["spec"], implementations)
    arrays = message["arrays"]
    names = [name for name in ("q", "k", "v", "learnable_sink") if arrays.get(name) is not None]
    with ARRAY_KINDS["jax"].precision(arrays):  # x64 for a float64 case only
        program = _jax_program(impl, message, programs)
        primals = [arrays[name] for name in names]  # NumPy: jit places them by the program's shardings
        if message["gradients"]:
            d_lse = arrays.get("d_lse")
            result, grads = program(primals, arrays["d_out"], np.zeros(1) if d_lse is None else d_lse)
        else:
            result, grads = program(*primals), None
        out, lse = split_result(result, message["return_lse"], lambda x: isinstance(x, jax.Array))
        reply = {"out": np.asarray(out).astype(np.float64), "out_dtype": str(out.dtype),
                 "lse": None if lse is None else np.asarray(lse).astype(np.float64),
                 "lse_dtype": None if lse is None else str(lse.dtype)}
        for name, grad in zip(names, grads or ()):
            reply[GRADIENT_NAMES[name]] = None if grad is None else np.asarray(grad).astype(np.float64)
    return reply

"""Sequence-parallel attention (``sdpa_sequence_parallel``): the sequence layouts and the SEQUENCE_PARALLEL
declaration.

The operation is sdpa of one sequence of L positions sharded over N devices along the sequence axis. Each device
(a JAX device inside ``shard_map``, a torch.distributed rank) is called with its shards of q, k and v and returns
its shard of the output; where each device's positions lie in the global sequence is the *sequence layout*:

- ``"contiguous"``: rank r holds one run of positions. The runs follow ``np.array_split(np.arange(L), N)``: their
  lengths differ by at most one and the first L % N ranks hold the longer ones.
- ``"zigzag"`` (ring-flash-attention's and torch context parallel's head-tail load balancing): the positions are
  cut into 2N chunks by ``np.array_split(np.arange(L), 2N)`` and rank r holds chunks r and 2N - 1 - r, in that
  order. Under causal attention every rank then holds as many (query, key) pairs as any other.

Causality, windows and everything else that depends on a position use these global positions, never a shard's
local index. ``shard_positions`` is the definition, ``shard`` and ``gather`` apply it to NumPy arrays.

An implementation states what it runs as an optional attribute (every key optional)::

    SEQUENCE_PARALLEL = {
        "layouts": ["contiguous", "zigzag"],   # the layouts it takes (default: both)
        "world_sizes": {"min": 2, "max": 8},   # N, as a dict or a list of ints (default: 2..8)
        "uneven_lengths": False,               # L not a multiple of N (of 2N for zigzag): array_split shards of
                                               # unequal length (default False; never for ARRAY "jax": shard_map
                                               # splits an axis into equal blocks)
        "heads": "any",                        # "divisible": Hq % N == 0 only (Ulysses' all-to-all over heads)
        "gradients": True,                     # differentiable through the collectives (default: GRADIENTS)
        "lse_gradients": False,                # lse differentiable too (a cotangent on it reaches q and k; default
                                               # False: the backward of FlashAttention, ring-flash-attention and
                                               # torch context parallelism ignores a cotangent on lse)
        "check_vma": True,                     # ARRAY "jax": shard_map's check_vma (False for code written
                                               # before jax's varying-manual-axes checks)
    }

A case outside the declaration is unsupported, never failed. ``parse_declaration`` validates it; its errors name
the implementation, the key and the value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attention_conformance.implementations.contract import SEQUENCE_LAYOUTS

KEYS = ("layouts", "world_sizes", "uneven_lengths", "heads", "gradients", "lse_gradients", "check_vma")


HEAD_RULES = ("any", "divisible")


# The suite's process groups and host meshes have this many members: the largest N it draws.
LARGEST_WORLD = 8


class DeclarationError(ValueError):
    """A SEQUENCE_PARALLEL declaration that does not parse; the message names the implementation, key and value."""


# ------------------------------------------------------------------ the layouts
def _run(total: int, parts: int, index: int) -> tuple[int, int]:
    """(start, stop) of part ``index`` of ``np.array_split(np.arange(total), parts)``."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def shard_positions(length: int, world_size: int, layout: str, rank: int) -> np.ndarray:
    """The global positions rank ``rank`` of ``world_size`` holds, in the order its shard holds them."""
    if layout == "contiguous":
        return np.arange(*_run(length, world_size, rank))
    if layout == "zigzag":
        first, second = _run(length, 2 * world_size, rank), _run(length, 2 * world_size, 2 * world_size - 1 - rank)
        return np.concatenate([np.arange(*first), np.arange(*second)])
    raise ValueError(f"unknown sequence layout {layout!r}; one of {list(SEQUENCE_LAYOUTS)}")


def rank_order(length: int, world_size: int, layout: str) -> np.ndarray:
    """The global positions of every rank's shard, rank 0's first: ``x[..., rank_order(...), :]`` is the sequence as
    the ranks hold it, one after the other (what shard_map splits into equal blocks)."""
    return np.concatenate([shard_positions(length, world_size, layout, r) for r in range(world_size)])


def shard_lengths(length: int, world_size: int, layout: str) -> list[int]:
    return [len(shard_positions(length, world_size, layout, r)) for r in range(world_size)]


def even(length: int, world_size: int, layout: str) -> bool:
    """Whether every rank holds as many positions (and, zigzag, both of its chunks as long as any other's)."""
    return length % (2 * world_size if layout == "zigzag" else world_size) == 0


def shard(x: np.ndarray, world_size: int, layout: str, axis: int = 2) -> list[np.ndarray]:
    """``x`` cut along ``axis`` (the sequence) into the shards of ranks 0 .. world_size - 1."""
    length = x.shape[axis]
    return [np.take(x, shard_positions(length, world_size, layout, r), axis=axis) for r in range(world_size)]


def gather(shards: list[np.ndarray], layout: str, axis: int = 2) -> np.ndarray:
    """The global array of the ranks' shards (the inverse of ``shard``)."""
    length = sum(s.shape[axis] for s in shards)
    joined = np.concatenate(shards, axis=axis)
    out = np.empty_like(joined)
    index = [slice(None)] * joined.ndim
    index[axis] = rank_order(length, len(shards), layout)
    out[tuple(index)] = joined
    return out


# ------------------------------------------------------------------ the declaration
@dataclass(frozen=True)
class SequenceParallelDeclaration:
    """What an implementation's sdpa_sequence_parallel runs (SEQUENCE_PARALLEL, defaults filled in)."""

    layouts: tuple[str, ...] = SEQUENCE_LAYOUTS
    world_sizes: tuple[int, ...] = tuple(range(2, LARGEST_WORLD + 1))
    uneven_lengths: bool = False
    heads_divisible: bool = False
    gradients: bool = True
    lse_gradients: bool = False
    check_vma: bool = True

    def why_outside(self, world_size: int, layout: str, length: int, query_heads: int) -> str | None:
        """Why a case of these facts is outside the declaration (None: inside)."""
        if layout not in self.layouts:
            return f"sequence layout {layout!r} (declared layouts: {', '.join(self.layouts)})"
        if world_size not in self.world_sizes:
            return f"N = {world_size} devices (declared world_sizes: {describe_sizes(self.world_sizes)})"
        if not self.uneven_lengths and not even(length, world_size, layout):
            what = "2N" if layout == "zigzag" else "N"
            return (f"L = {length} is not a multiple of {what} = {(2 if layout == 'zigzag' else 1) * world_size} "
                    "(declared uneven_lengths: False)")
        if self.heads_divisible and query_heads % world_size:
            return f"Hq = {query_heads} is not a multiple of N = {world_size} (declared heads: 'divisible')"
        return None

    def describe(self) -> dict:
        return {"layouts": list(self.layouts), "world_sizes": describe_sizes(self.world_sizes),
                "uneven_lengths": self.uneven_lengths, "heads": "divisible" if self.heads_divisible else "any",
                "gradients": self.gradients, "lse_gradients": self.lse_gradients, "check_vma": self.check_vma}


def describe_sizes(sizes: tuple[int, ...]) -> str:
    if len(sizes) > 2 and sizes == tuple(range(sizes[0], sizes[-1] + 1)):
        return f"{sizes[0]}..{sizes[-1]}"
    return ", ".join(map(str, sizes))


def _sizes(value, where: str) -> tuple[int, ...]:
    if isinstance(value, dict):
        unknown = set(value) - {"min", "max"}
        low, high = value.get("min", 2), value.get("max", LARGEST_WORLD)
        if unknown or not (isinstance(low, int) and isinstance(high, int) and 2 <= low <= high):
            raise DeclarationError(f"{where}['world_sizes']={value!r} must be {{'min': n, 'max': m}} with "
                                   "2 <= n <= m, or a list of ints >= 2")
        return tuple(range(low, high + 1))
    if isinstance(value, (list, tuple)) and value and all(isinstance(n, int) and not isinstance(n, bool) and n >= 2
                                                          for n in value):
        return tuple(sorted(set(value)))
    raise DeclarationError(f"{where}['world_sizes']={value!r} must be a list of ints >= 2 or "
                           "{'min': n, 'max': m}")


def parse_declaration(declared, array: str, gradients: bool = True, where: str = "SEQUENCE_PARALLEL"
                      ) -> SequenceParallelDeclaration:
    """SEQUENCE_PARALLEL validated, defaults filled in (None: every default). ``array``: the implementation's ARRAY
    (uneven lengths are refused for "jax"); ``gradients``: its GRADIENTS, the default of "gradients"; ``where``
    names the declaration in errors ("<spec>: SEQUENCE_PARALLEL")."""
    if declared is None:
        declared = {}
    if not isinstance(declared, dict):
        raise DeclarationError(f"{where} must be a dict, got {type(declared).__name__}")
    unknown = sorted(set(declared) - set(KEYS))
    if unknown:
        raise DeclarationError(f"{where} has unknown keys {unknown}; allowed: {', '.join(KEYS)}")
    found: dict[str, Any] = {"gradients": gradients}
    if "layouts" in declared:
        layouts = declared["layouts"]
        if isinstance(layouts, str) or not isinstance(layouts, (list, tuple)) or not layouts \
                or any(name not in SEQUENCE_LAYOUTS for name in layouts):
            raise DeclarationError(f"{where}['layouts']={layouts!r} must list some of {list(SEQUENCE_LAYOUTS)}")
        found["layouts"] = tuple(name for name in SEQUENCE_LAYOUTS if name in layouts)
    if "world_sizes" in declared:
        found["world_sizes"] = _sizes(declared["world_sizes"], where)
    for key in ("uneven_lengths", "gradients", "lse_gradients", "check_vma"):
        if key in declared:
            if not isinstance(declared[key], bool):
                raise DeclarationError(f"{where}[{key!r}]={declared[key]!r} must be True or False")
            found[key] = declared[key]
    if found.get("uneven_lengths") and array == "jax":
        raise DeclarationError(f"{where}['uneven_lengths']=True with ARRAY 'jax': shard_map splits the sequence "
                               "into equal blocks, so a JAX implementation pads or refuses uneven lengths itself "
                               "and declares False")
    if "heads" in declared:
        if declared["heads"] not in HEAD_RULES:
            raise DeclarationError(f"{where}['heads']={declared['heads']!r} must be one of {list(HEAD_RULES)}")
        found["heads_divisible"] = declared["heads"] == "divisible"
    return SequenceParallelDeclaration(**found)


_PARSED: dict[int, tuple[Any, SequenceParallelDeclaration]] = {}


def declaration_of(impl) -> SequenceParallelDeclaration:
    """The parsed SEQUENCE_PARALLEL of a registry Implementation (once per object); raises DeclarationError naming
    the implementation."""
    key = id(impl.obj)
    if key not in _PARSED or _PARSED[key][0] is not impl.obj:
        where = f"{impl.spec or impl.name}: SEQUENCE_PARALLEL"
        _PARSED[key] = (impl.obj, parse_declaration(getattr(impl.obj, "SEQUENCE_PARALLEL", None), impl.array,
                                                    impl.gradients, where))
    return _PARSED[key][1]

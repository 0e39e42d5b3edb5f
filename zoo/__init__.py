"""Self-check zoo for the attention conformance suite.

Every module ``broken_*`` is a deliberately wrong implementation that the suite
must reject with a failure naming one of its ``EXPECTED_CLAUSES``; every module
``correct_*`` is a correct alternative implementation that must pass (operations
it does not expose must be reported unsupported). Each member module exposes
some of ``softmax``, ``sdpa``, ``multi_head_attention`` and the attributes

    BUG                str        one sentence ("none" for correct members)
    SOURCE             str        where the bug comes from (document + cell, a known bug class, or "zoo extra")
    EXPECTED_CLAUSES   frozenset  clause ids of spec/clauses.yaml (empty for correct members)
    DTYPES, ARRAY, FULLY_MASKED_ROWS   optional, as in the public contract

``zoo._reference`` is the float64 reference the broken members are derived from
(each changes one line, marked ``# BUG``). See zoo/README.md for the table.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

PREFIXES = ("broken_", "correct_")


def member_names(kind: str | None = None) -> list[str]:
    """Sorted module names of the zoo; kind "broken" or "correct" filters."""
    names = [m.name for m in pkgutil.iter_modules(__path__)
             if m.name.startswith(PREFIXES)]
    if kind is not None:
        names = [n for n in names if n.startswith(kind + "_")]
    return sorted(names)


def load(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}")


def members(kind: str | None = None) -> list[tuple[str, ModuleType]]:
    return [(n, load(n)) for n in member_names(kind)]

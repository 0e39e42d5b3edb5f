"""spec/: where the suite's data lies, reading YAML safely, the JSON Schemas, and the clauses.

Any defect stops the run with one SpecError that names the file, the entry id and the field. Everything here is
read once per session and cached. The fixtures are loaded by conformance/cases/fixtures.py.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# spec/ and fixtures/ lie beside conformance/ in both layouts: a source checkout's root, and the
# installed package attention_conformance/ (package data of the wheel).
ROOT = Path(__file__).resolve().parent.parent


SPEC_DIR = ROOT / "spec"


# Another fixtures directory can be validated and run by pointing this variable at it.
FIXTURES_DIR = Path(os.environ.get("ATTENTION_CONFORMANCE_FIXTURES", ROOT / "fixtures"))




class SpecError(Exception):
    """A defect in spec/ or fixtures/. The message names file, entry and field.

    ``problems`` lists every defect found (one line each); ``SpecError.of`` joins several.
    """

    def __init__(self, path: Path, entry: str | None, field_: str | None, problem: str):
        where = relative(path)
        if entry:
            where += f": entry {entry!r}"
        if field_:
            where += f": field {field_!r}"
        self.problems = [f"{where}: {problem}"]
        super().__init__(self.problems[0])

    @classmethod
    def of(cls, errors: list["SpecError"]) -> "SpecError":
        """One error listing the problems of several (each on its own line, naming file, entry and field)."""
        if len(errors) == 1:
            return errors[0]
        problems = [line for error in errors for line in error.problems]
        joined = cls.__new__(cls)
        joined.problems = problems
        Exception.__init__(joined, f"{len(problems)} problems in spec/ or fixtures/:\n" + "\n".join(problems))
        return joined


def relative(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# libyaml's safe loader when PyYAML was built with it: the same safe subset, about
# ten times faster than the pure-Python one on fixtures/ (startup of every run).
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.load(handle, Loader=SafeLoader)  # noqa: S506 -- a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise SpecError(path, None, None, f"malformed YAML at {where}: {getattr(exc, 'problem', exc)}") from None


@functools.lru_cache(maxsize=None)
def _validator(schema_name: str):
    return jsonschema.Draft202012Validator(read_yaml(SPEC_DIR / "schema" / schema_name))


def _validate(document: Any, schema_name: str, path: Path, list_key: str) -> None:
    """Check ``document`` against the schema; every defect (the most relevant one per entry) in one SpecError."""
    errors = schema_problems(document, schema_name, path, list_key)
    if errors:
        raise SpecError.of([error for _, error in errors])


def schema_problems(document: Any, schema_name: str, path: Path, list_key: str) -> list[tuple[int | None, SpecError]]:
    """Every schema defect of the document: (entry index or None, error), the most relevant one per entry."""
    if document is None:
        return [(None, SpecError(path, None, None, "file is empty"))]
    errors = sorted(_validator(schema_name).iter_errors(document), key=lambda e: list(e.absolute_path))
    groups: dict[int | None, list] = {}
    for error in errors:
        location = list(error.absolute_path)
        index = location[1] if len(location) >= 2 and location[0] == list_key and isinstance(location[1], int) else None
        groups.setdefault(index, []).append(error)
    if None in groups:  # the document itself is malformed: its entries cannot be told apart
        groups = {None: groups[None]}
    found = []
    for index, group in groups.items():
        error = jsonschema.exceptions.best_match(group)
        location = list(error.absolute_path)
        entry = None
        if index is not None:
            items = document.get(list_key) or []
            item = items[index] if index < len(items) else {}
            entry = item.get("id", f"#{index}") if isinstance(item, dict) else f"#{index}"
            location = location[2:]
        field_ = ".".join(str(part) for part in location) or None
        found.append((index, SpecError(path, entry, field_, error.message)))
    return found


# ------------------------------------------------------------------- clauses
@dataclass(frozen=True)
class Clause:
    id: str
    statement: str
    binds: tuple[str, ...]
    source: str


@functools.lru_cache(maxsize=None)
def clauses(spec_dir: Path = SPEC_DIR) -> dict[str, Clause]:
    found: dict[str, Clause] = {}
    paths = sorted(Path(spec_dir).glob("clauses*.yaml"))
    if not paths:  # a suite without its spec would judge nothing and say so nowhere
        raise SpecError(Path(spec_dir), None, None, f"no clauses*.yaml in {Path(spec_dir).resolve()}: the suite's "
                        "spec/ is missing (an installed suite ships it as package data: reinstall the suite)")
    for path in paths:
        document = read_yaml(path)
        _validate(document, "clauses.schema.yaml", path, "clauses")
        for item in document["clauses"]:
            if item["id"] in found:
                raise SpecError(path, item["id"], "id", "duplicate clause id")
            found[item["id"]] = Clause(item["id"], item["statement"], tuple(item["binds"]), item["source"])
    return found

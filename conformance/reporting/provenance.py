"""What a report carries so that two reports can be compared (conformance/reporting/baseline.py) and the reports of
several
runners put together (conformance/reporting/merge.py): a digest of the spec the verdicts were judged by, each
implementation's version, the installed versions of the frameworks, and the key of the run's environment.

Nothing here imports a framework: installed versions come from the distributions' metadata.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import sys
from pathlib import Path

from attention_conformance.conformance.reporting.environment import SUITE_MODULES
from attention_conformance.conformance.specdata import FIXTURES_DIR, SPEC_DIR
from attention_conformance.implementations import arrays

SPEC_HASH_CHARS = 16


def spec_hash(spec_dir: Path = SPEC_DIR, fixtures_dir: Path = FIXTURES_DIR) -> str:
    """A digest of every YAML file the verdicts are judged by: clauses, tolerances, their schemas and the fixtures
    (file names and contents). Two reports with the same digest were judged by the same clauses and tolerances."""
    digest = hashlib.sha256()
    for directory in (Path(spec_dir), Path(fixtures_dir)):
        for path in sorted(directory.rglob("*.yaml")):
            digest.update(f"{directory.name}/{path.relative_to(directory).as_posix()}\n".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:SPEC_HASH_CHARS]


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def installed_versions() -> dict[str, str]:
    """The installed version of each framework an array adapter names and of the suite's own dependencies, read
    from package metadata (imported or not): the same in every shard of one runner, unlike the imported versions
    of ``environment.versions``, which depend on the items a process ran."""
    names = [name for adapter in arrays.ARRAY_KINDS.values() for name in adapter.VERSION_MODULES]
    names += list(SUITE_MODULES)
    found = {}
    for name in dict.fromkeys(names):
        version = _distribution_version(name)
        if version:
            found[name] = version
    return found


def implementation_version(impl) -> str | None:
    """The version of what an implementation runs: its own ``VERSION`` or ``__version__``, else its module's or
    top-level package's ``__version__``, else the installed distribution that provides that package; a built-in's
    is its framework's (``torch 2.13.0``). None when nothing says."""
    obj = impl.obj
    for attribute in ("VERSION", "__version__"):
        value = getattr(obj, attribute, None)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    if impl.spec.startswith("builtin:"):
        framework = arrays.ARRAY_KINDS[impl.array].VERSION_MODULES[:1]
        version = _distribution_version(framework[0]) if framework else None
        return f"{framework[0]} {version}" if version else None
    module_name = obj.__name__ if isinstance(obj, type(sys)) else getattr(obj, "__module__", None) or ""
    top = module_name.split(".")[0]
    for name in dict.fromkeys([module_name, top]):
        value = getattr(sys.modules.get(name), "__version__", None)
        if isinstance(value, str):
            return value
    try:
        distributions = importlib.metadata.packages_distributions().get(top, [])
    except Exception:  # a broken installation's metadata must not break the report
        distributions = []
    for distribution in distributions:
        version = _distribution_version(distribution)
        if version:
            return f"{distribution} {version}"
    return None


def machine() -> str:
    """The OS and architecture (``Linux x86_64``): part of the environment key, unlike the kernel release."""
    return f"{platform.system()} {platform.machine()}"


def accelerators(devices: dict) -> list[str]:
    """The accelerator models of a report's ``environment.devices`` (``NVIDIA H100 80GB HBM3``), without their
    indices and without JAX's CPU device."""
    names = set()
    for kind, listed in devices.items():
        if kind == "cpu" or not isinstance(listed, list):
            continue
        for entry in listed:
            place, _, model = str(entry).partition(" ")
            if not place.startswith("cpu") and model:
                names.add(model)
    return sorted(names)


def environment_key(environment: dict) -> dict:
    """What makes two runs one environment in a merged report: the runner's label (--environment-label), Python, OS
    and architecture, the installed framework versions (else the imported ones, for a report that predates them)
    and the accelerator models. Not the processor name or the kernel release: shards of one CI job land on hosted
    runners that differ in those."""
    versions = environment.get("installed") or {
        name: version for name, version in (environment.get("versions") or {}).items() if version and name != "python"}
    return {
        "label": environment.get("label") or "",
        "python": (environment.get("versions") or {}).get("python"),
        "machine": environment.get("machine") or "",
        "versions": dict(sorted(versions.items())),
        "accelerators": accelerators(environment.get("devices") or {}),
    }


def describe_key(key: dict) -> str:
    """The key in words, for a column heading: ``cpu-runner · Python 3.11.9 · Linux x86_64 · torch 2.13.0 ...``."""
    frameworks = [f"{name} {version}" for name, version in key["versions"].items() if name not in SUITE_MODULES]
    parts = [key["label"], f"Python {key['python']}" if key["python"] else "", key["machine"], *frameworks,
             *key["accelerators"]]
    return " · ".join(part for part in parts if part)


def digest(value) -> str:
    """A short stable digest of a JSON value."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]

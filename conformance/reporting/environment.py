"""The machine and libraries of a run, for the report's ``environment``: this process's, and under xdist the
workers' (each sends its own, conformance/reporting/transport.py), united."""
from __future__ import annotations

import platform

from attention_conformance.implementations import arrays

SUITE_MODULES = ("ml_dtypes", "hypothesis", "pytest")  # the suite's own dependencies; frameworks come from adapters


def _framework_versions() -> dict[str, str | None]:
    """Python, each registered array framework (its adapter's version probe) and the suite's dependencies."""
    versions = {"python": platform.python_version(), **arrays.framework_versions()}
    versions.update({name: arrays.module_version(name) for name in SUITE_MODULES})
    return versions


def _device_info() -> dict:
    """cpu: the processor; then what each array adapter reports of its started devices (cuda: torch's GPUs,
    jax: JAX's devices). Nothing is imported or started for this: a framework the process never loaded (or
    JAX with no backend initialised) adds nothing.
    """
    info: dict = {"cpu": platform.processor() or platform.machine(), **arrays.device_info()}
    return {key: value for key, value in info.items() if value}


def local_environment() -> dict:
    """This process's versions and devices: what an xdist worker sends the controller (transport.send_to_controller).

    Plain str, list and dict only (execnet refuses other types, and the whole workeroutput with them).
    """
    devices = {kind: str(v) if isinstance(v, str) else [str(x) for x in v] for kind, v in _device_info().items()}
    return {"versions": _framework_versions(), "devices": devices}


# What the xdist workers reported (transport merges each into it); empty without xdist.
WORKER_ENVIRONMENT: dict = {"versions": {}, "devices": {}}


def _merge_environment(into: dict, env: dict) -> None:
    """Merge ``env`` into ``into``: the first non-null version and device name win; device lists are united."""
    for name, version in (env.get("versions") or {}).items():
        if version and not into["versions"].get(name):
            into["versions"][name] = version
        into["versions"].setdefault(name, None)
    for kind, names in (env.get("devices") or {}).items():
        if isinstance(names, str):
            into["devices"].setdefault(kind, names)
        elif names:
            known = into["devices"].setdefault(kind, [])
            known[:] = sorted(set(known) | set(names))


def merge_worker_environment(env: dict) -> None:
    """The controller merges one worker's ``local_environment()`` into WORKER_ENVIRONMENT."""
    _merge_environment(WORKER_ENVIRONMENT, env or {})


def environment() -> dict:
    """The report's environment: this process's versions and devices, completed and united with the workers'."""
    merged: dict = {"versions": {}, "devices": {}}
    _merge_environment(merged, local_environment())
    _merge_environment(merged, WORKER_ENVIRONMENT)
    return {**merged, "platform": platform.platform()}


def united(environments: list[dict]) -> dict:
    """Several reports' ``environment`` as one (the shards of one split run, the runs of one merged environment):
    versions and device lists merged as the controller merges its workers'; platform, machine, label and installed
    versions from the first that has them."""
    merged: dict = {"versions": {}, "devices": {}}
    for env in environments:
        _merge_environment(merged, env)
    out = {**merged, "platform": next((env["platform"] for env in environments if env.get("platform")), "")}
    for key in ("machine", "label", "installed"):
        found = next((env[key] for env in environments if env.get(key)), None)
        if found:
            out[key] = found
    return out

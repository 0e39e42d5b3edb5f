"""End-of-run summary in the terminal and the JSON conformance report."""
from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

from . import checks
from .specdata import ROOT

SUITE_VERSION = "0.1.0"
REPORT_SCHEMA_VERSION = 1


def _counts():
    per_impl: dict[str, Counter] = defaultdict(Counter)
    for rec in checks.RECORDS:
        per_impl[rec.implementation][rec.status] += 1
    return per_impl


def terminal_summary(tr, config) -> None:
    per_impl = _counts()
    if not per_impl:
        return
    tr.section("attention conformance")
    for name, counts in sorted(per_impl.items()):
        parts = ", ".join(f"{counts[s]} {s}" for s in ("passed", "failed", "deviation", "unsupported") if counts[s])
        tr.write_line(f"{name:<18} {parts}")
    failed = defaultdict(set)
    for rec in checks.RECORDS:
        if rec.status == "failed":
            failed[rec.implementation].add(rec.clause)
    for name, clause_ids in sorted(failed.items()):
        tr.write_line(f"{name} breaks: {', '.join(sorted(clause_ids))}")
    from . import agreement

    agreement.terminal_summary(tr)


def _framework_versions() -> dict[str, str | None]:
    versions = {"python": platform.python_version()}
    for name in ("numpy", "torch", "jax", "jaxlib", "ml_dtypes", "hypothesis", "pytest"):
        module = sys.modules.get(name)
        versions[name] = getattr(module, "__version__", None) if module else None
    return versions


def _device_info() -> dict:
    info = {"cpu": platform.processor() or platform.machine()}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["cuda"] = torch.cuda.get_device_name(0)
    return info


def _commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def build_report(config, exitstatus) -> dict:
    from . import agreement, plugin

    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "suite": {"name": "attention-conformance", "version": SUITE_VERSION, "commit": _commit()},
        "exit_status": int(exitstatus),
        "environment": {"versions": _framework_versions(), "devices": _device_info(), "platform": platform.platform()},
        "implementations": [impl.describe() for impl in plugin.implementations(config)],
        "summary": {name: dict(c) for name, c in _counts().items()},
        "cases": [rec.as_dict() for rec in checks.RECORDS],
        "agreement": agreement.matrix(),
    }


def write_report(config, path: str, exitstatus) -> None:
    report = build_report(config, exitstatus)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=1, default=float))
    from . import html_report

    html_report.write(report, target.with_suffix(".html"))

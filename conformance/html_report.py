"""The HTML page written beside the JSON report (filled in by the report issue)."""
from __future__ import annotations

import html
from pathlib import Path


def write(report: dict, path: Path) -> None:
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{html.escape(str(counts))}</td></tr>"
        for name, counts in report["summary"].items()
    )
    path.write_text(f"<html><body><h1>attention-conformance</h1><table>{rows}</table></body></html>")

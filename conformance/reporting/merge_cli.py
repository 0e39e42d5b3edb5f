"""``attention-conformance merge REPORT... -o combined.json``: the command line of merge.py (reading, the baseline,
the JSON and its HTML page, the durations file).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attention_conformance.conformance.reporting.merge import (
    MergeError,
    durations,
    exit_status,
    merge,
    read_report,
    terminal_lines,
)


def report_paths(arguments) -> list[Path]:
    """Files as given; a directory stands for every *.json and *.json.gz under it (as a CI's downloaded artifacts
    lie), in name order."""
    paths: list[Path] = []
    for argument in arguments:
        path = Path(argument)
        if path.is_dir():
            paths.extend(sorted(p for p in path.rglob("*") if p.name.endswith((".json", ".json.gz")) and p.is_file()))
        else:
            paths.append(path)
    return paths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attention-conformance merge",
        description="Merge the JSON reports of several runners (and the shards of a split run) into one matrix "
                    "of implementation x device x environment x clause (docs/report.md, 'The merged report').")
    parser.add_argument("reports", nargs="+", metavar="REPORT",
                        help="JSON reports (.json or .json.gz) written by --conformance-report, or directories "
                             "holding them")
    parser.add_argument("-o", "--output", metavar="PATH",
                        help="write the merged JSON report here (.gz: compressed) and its HTML page beside it")
    parser.add_argument("--html", metavar="PATH", help="write the HTML page here instead of beside --output")
    parser.add_argument("--baseline", metavar="OLD.json",
                        help="compare with an earlier report (a runner's or a merged one): what broke, what was "
                             "fixed, deviations added or gone")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="with --baseline: exit 1 when a clause broke that was not broken in the baseline")
    parser.add_argument("--durations-out", metavar="PATH",
                        help="write every item's measured duration in the reports, for --shard-durations")
    return parser


def main(argv: list[str]) -> int:
    from attention_conformance.conformance.reporting import baseline, html_report, json_report, merged_html

    args = _parser().parse_args(argv)
    if args.fail_on_regression and not args.baseline:
        print("attention-conformance merge: --fail-on-regression needs --baseline", file=sys.stderr)
        return 2
    try:
        paths = report_paths(args.reports)
        reports = [read_report(path) for path in paths]
        merged = merge([str(path) for path in paths], reports)
        old = baseline.read(args.baseline) if args.baseline else None
    except (MergeError, baseline.BaselineError) as exc:
        print(f"attention-conformance merge: {exc}", file=sys.stderr)
        return 2
    status = exit_status(merged)
    if old is not None:
        merged["baseline"] = baseline.compare(merged, old, args.baseline)
        if args.fail_on_regression and merged["baseline"]["newly_broken"]:
            status = 1
    for line in terminal_lines(merged) + (baseline.terminal_lines(merged["baseline"]) if old is not None else []):
        print(line)
    if args.output:
        target = Path(args.output)
        target.parent.mkdir(parents=True, exist_ok=True)
        json_report.write_json(target, merged)
        page = Path(args.html) if args.html else html_report.html_path(target)
        merged_html.write(merged, page)
        print(f"merged report: {target} and {page}")
    elif args.html:
        merged_html.write(merged, Path(args.html))
        print(f"merged page: {args.html}")
    if args.durations_out:
        from attention_conformance.conformance.reporting.shards import durations_file

        measured = durations(reports)
        Path(args.durations_out).write_text(durations_file(measured), encoding="utf-8")
        print(f"durations of {len(measured)} items: {args.durations_out}")
    return status

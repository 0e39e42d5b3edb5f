"""The HTML page written beside the JSON report: one self-contained file.

``write(report, path)`` takes the dict built by ``conformance.json_report.build_report``
(documented in docs/report.md and docs/report-schema.json) and writes a page that
reads without the terminal: run header and environment, one summary per
implementation, the clause x implementation matrix, the cross-backend agreement
per dtype, a plot of each judged case's worst error / allowed error (the ratio the
verdict compares with 1), and one row per group of failures with its case, worst
element and ratio, the full message and repro folded in a <details>. CSS is inline
and the plot is an embedded PNG, so the file can be mailed or uploaded as a CI
artifact on its own. matplotlib is optional: without it the plot's figures are a
table. Every piece of text goes through html.escape.
"""
from __future__ import annotations

import base64
import html
import io
import math
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable

STATUSES = ("passed", "failed", "deviation", "unsupported", "skipped")


DTYPE_ORDER = ("float64", "float32", "float16", "bfloat16")


EXIT_MEANINGS = {
    0: "every applicable case passed",
    1: "some tests failed",
    2: "the run was interrupted",
    3: "internal error",
    4: "usage error (bad option, spec or implementation)",
    5: "no tests were collected",
}


STATUS_COLOURS = {  # background, text
    "passed": ("#c7e9c0", "#14451a"),
    "failed": ("#f8c4c4", "#6b0f0f"),
    "deviation": ("#fde2b0", "#6b4300"),
    "unsupported": ("#e4e4e4", "#444444"),
    "skipped": ("#e4e4e4", "#444444"),
    "none": ("#f3f3f3", "#8a8a8a"),
}


PLOT_COLOURS = {"passed": "#2e7d32", "failed": "#c62828", "deviation": "#ef8f00"}


MAX_FAILURE_GROUPS = 300


CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; color: #1d1d1d;
       margin: 0 auto; padding: 1.2em 2em 3em; max-width: 1500px; }
h1 { font-size: 1.6em; margin: 0 0 .2em; }
h2 { font-size: 1.25em; margin: 1.8em 0 .5em; border-bottom: 1px solid #ddd; padding-bottom: .2em; }
h3 { font-size: 1.05em; margin: 1.2em 0 .4em; }
p.note, .note { color: #555; font-size: .92em; }
table { border-collapse: collapse; margin: .4em 0 1em; }
th, td { border: 1px solid #d6d6d6; padding: .25em .55em; text-align: left; vertical-align: top; }
th { background: #f5f5f5; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .9em; }
pre { background: #f7f7f7; border: 1px solid #e2e2e2; padding: .6em .8em; overflow-x: auto; margin: .3em 0;
      white-space: pre-wrap; word-break: break-word; }
.badge { display: inline-block; padding: .1em .6em; border-radius: .8em; font-weight: 600; }
.ok { background: #c7e9c0; color: #14451a; } .bad { background: #f8c4c4; color: #6b0f0f; }
.meta td:first-child { font-weight: 600; background: #fafafa; }
table.matrix td.cell { text-align: center; min-width: 6.5em; cursor: default; white-space: nowrap; }
table.matrix th.clause { font-weight: normal; white-space: nowrap; }
table.matrix th.impl { text-align: center; }
.legend span { display: inline-block; padding: .1em .6em; margin-right: .4em; border: 1px solid #ccc; }
table.failures td { max-width: 1100px; }
.counts span { margin-right: .6em; white-space: nowrap; }
img.plot { max-width: 100%; border: 1px solid #e2e2e2; }
details summary { cursor: pointer; color: #1a4f8b; }
table.failures td { font-size: .93em; }
table.failures details pre { max-width: 1000px; }
"""


def html_path(path: Path) -> Path:
    """The page beside the JSON report: reports/c.json and reports/c.json.gz both give reports/c.html."""
    path = Path(path)
    return (path.with_suffix("") if path.suffix == ".gz" else path).with_suffix(".html")


def e(value: Any) -> str:
    """Escape any value for HTML text or an attribute."""
    return html.escape("" if value is None else str(value), quote=True)


# --------------------------------------------------------------------------- helpers
def table_html(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "",
               numeric: Iterable[int] = ()) -> str:
    """A table from already-escaped cell HTML."""
    numeric = set(numeric)
    head = "".join(f'<th{" class=num" if i in numeric else ""}>{h}</th>' for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>' for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f'<table class="{e(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}e}" if value != 0 else "0"
    return str(value)


def _dtype_key(dtype: str) -> tuple:
    return (DTYPE_ORDER.index(dtype) if dtype in DTYPE_ORDER else len(DTYPE_ORDER), dtype)


def _counts_text(counts: Counter) -> str:
    parts = [f"{counts[s]} {s}" for s in STATUSES if counts.get(s)]
    return ", ".join(parts) or "no cases"


def cell_status(counts: Counter) -> str:
    if counts.get("failed"):
        return "failed"
    if counts.get("deviation"):
        return "deviation"
    if counts.get("passed"):
        return "passed"
    if counts.get("unsupported") or counts.get("skipped"):
        return "unsupported"
    return "none"


def _policy_text(policy: Any) -> str:
    """FULLY_MASKED_ROWS in words: by mask kind ("bool mask: uniform"), by cause ("window rows: zeros"), by dtype."""
    if not isinstance(policy, dict):
        return str(policy)

    def key_text(key: str) -> str:
        return f"{key} mask" if key in ("bool", "float") else key if key in DTYPE_ORDER else f"{key} rows"

    return ", ".join(f"{key_text(key)}: " + (f"({_policy_text(value)})" if isinstance(value, dict) else str(value))
                     for key, value in policy.items())


def _dtypes_text(dtypes: Any) -> str:
    if isinstance(dtypes, dict):
        return "; ".join(f"{device}: {', '.join(names) or 'none'}" for device, names in dtypes.items())
    return ", ".join(dtypes or []) or "none"


def clause_ids(cases: list[dict]) -> tuple[list[str], dict[str, str], dict[str, tuple[str, ...]]]:
    """Clause ids in spec order (then any the cases name that the spec lacks), statements and bound operations."""
    statements: dict[str, str] = {}
    binds: dict[str, tuple[str, ...]] = {}
    try:
        from attention_conformance.conformance.specdata import clauses

        for cid, clause in clauses().items():
            statements[cid], binds[cid] = clause.statement, tuple(clause.binds)
    except Exception:  # the page must still be written when spec/ cannot be read
        statements, binds = {}, {}
    ids = list(statements)
    for case in cases:
        cid = case.get("clause")
        if cid and cid not in statements and cid not in ids:
            ids.append(cid)
    return ids, statements, binds


# --------------------------------------------------------------------------- sections
def _header(report: dict, path: Path) -> str:
    suite = report.get("suite") or {}
    status = report.get("exit_status")
    meaning = EXIT_MEANINGS.get(status, "unknown")
    badge = "ok" if status == 0 else "bad"
    commit = suite.get("commit")
    found = [p for p in (path.with_suffix(".json"), path.with_suffix(".json.gz")) if p.exists()]
    json_link = (f' · <a href="{e(found[0].name)}">{e(found[0].name)}</a> (the full JSON report)'
                 if found else "")
    rows = [
        ("suite", f"{e(suite.get('name', 'attention-conformance'))} {e(suite.get('version'))}"),
        ("commit", f'<span class="mono" title="{e(commit)}">{e(commit or "unknown (not a git checkout)")}</span>'),
        ("exit status", f'<span class="badge {badge}">{e(status)}</span> {e(meaning)}'),
        ("complete", "yes: the run went to its end" if report.get("complete", True) else
         f'<span class="badge bad">no</span> {e(report.get("incomplete_reason") or "the run stopped early")}: '
         "the counts and cases are those judged before it stopped"),
        ("report schema", f"version {e(report.get('schema_version'))}{json_link}"),
    ]
    shard = report.get("shard")
    if shard:
        rows.append(("shard", f"{e(shard.get('index'))}/{e(shard.get('count'))}: {e(shard.get('items'))} of "
                              f"{e(shard.get('of'))} items; <code>attention-conformance merge</code> puts the "
                              f"{e(shard.get('count'))} reports together and applies the coverage rule to all"))
    meta = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<h1>attention-conformance report</h1><table class="meta">{meta}</table>'


def _environment(report: dict) -> str:
    env = report.get("environment") or {}
    versions = env.get("versions") or {}
    devices = env.get("devices") or {}
    version_rows = [(e(name), e(v) if v else '<span class="note">not loaded in this run</span>')
                    for name, v in versions.items()]
    device_rows = [(e(name), "<br>".join(e(x) for x in v) if isinstance(v, list) else e(v))
                   for name, v in devices.items()]
    out = ["<h2>Environment</h2>", f'<p>Platform: <span class="mono">{e(env.get("platform"))}</span></p>',
           '<div style="display:flex; gap:2em; flex-wrap:wrap"><div><h3>Versions</h3>',
           table_html(["package", "version"], version_rows, "meta"),
           '<p class="note">A framework is listed only if the run imported it.</p></div>',
           "<div><h3>Devices</h3>", table_html(["device", "name"], device_rows, "meta"),
           '<p class="note">cuda: the GPUs torch saw (only when the run imported torch); jax: the devices of '
           "JAX's started backends (only when the run used JAX). Under xdist, united over the workers.</p>"
           "</div></div>"]
    return "".join(out)


def _implementations(report: dict, counts: dict[str, Counter], names: list[str]) -> str:
    described = {d.get("name"): d for d in report.get("implementations") or []}
    summary = report.get("summary") or {}
    rows = []
    for name in names:
        d = described.get(name, {})
        c = counts.get(name, Counter())
        count_html = '<span class="counts">' + "".join(
            f'<span style="background:{STATUS_COLOURS[s][0]};color:{STATUS_COLOURS[s][1]};padding:0 .3em">'
            f"{c.get(s, 0)} {s}</span>" for s in STATUSES if c.get(s) or s in ("passed", "failed")
        ) + "</span>"
        operations = (summary.get(name) or {}).get("operations") or {}
        if operations:
            count_html += '<div class="note">judged per operation: ' + ", ".join(
                f"{e(op)} {e((n or {}).get('judged', 0))}" for op, n in operations.items()) + "</div>"
        reasons = (summary.get(name) or {}).get("unsupported_reasons") or []
        if reasons:
            count_html += '<div class="note">top unsupported reasons:<br>' + "<br>".join(
                f"{e(r.get('count'))} × {e(r.get('reason'))}" for r in reasons) + "</div>"
        ops = [op for op, present in (d.get("operations") or {}).items() if present]
        deviations = d.get("known_deviations") or []
        deviation_html = "<br>".join(
            f"<code>{e(x.get('clause'))}</code>: {e(x.get('reason'))}" for x in deviations
        ) or "none"
        devices = ", ".join(d.get("devices") or []) or "none present"
        notes = e(d.get("skip_reason")) if d.get("skip_reason") else ""
        rows.append([
            f"<b>{e(name)}</b><br><span class=\"note mono\">{e(d.get('spec'))}</span>",
            count_html,
            e(_dtypes_text(d.get("dtypes"))),
            e(_policy_text(d.get("fully_masked_rows", "zeros"))),
            deviation_html,
            e(", ".join(ops) or "none"),
            f"{e(d.get('array', ''))}<br>{e(devices)}",
            notes,
        ])
    return ("<h2>Implementations</h2>"
            + table_html(["implementation", "cases by status", "declared dtypes", "fully masked rows",
                      "known deviations", "operations", "array / devices", "skipped because"], rows)
            + '<p class="note">Counts are distinct cases (a fixture case, or a Hypothesis example: each once, '
              "however often it was replayed), not pytest tests. <i>deviation</i>: a failure the implementation "
              "declared in KNOWN_DEVIATIONS, or a fully masked row answered with its declared non-canonical "
              "policy. <i>unsupported</i>: a case the implementation cannot take (dtype, keyword, "
              "NotImplementedError); never a failure.</p>")


def _matrix(cases: list[dict], names: list[str], described: dict[str, dict]) -> str:
    ids, statements, binds = clause_ids(cases)
    cells: dict[tuple[str, str], Counter] = defaultdict(Counter)
    detail: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for case in cases:
        key = (case.get("clause"), case.get("implementation"))
        cells[key][case.get("status")] += 1
        detail[key][(case.get("device"), case.get("dtype"), case.get("status"))] += 1
    head = '<th>clause</th>' + "".join(f'<th class="impl">{e(n)}</th>' for n in names)
    body = []
    for cid in ids:
        row = [f'<th class="clause" id="clause-{e(cid)}" title="{e(statements.get(cid, "not in spec/clauses.yaml"))}">'
               f"<code>{e(cid)}</code></th>"]
        for name in names:
            counts = cells.get((cid, name), Counter())
            state = cell_status(counts)
            bg, fg = STATUS_COLOURS[state]
            total = sum(counts.values())
            operations = (described.get(name) or {}).get("operations") or {}
            bound = binds.get(cid, ())
            # Only operations describe() reports on: a clause binding another (a backward pass, say) is left as is.
            lacks = bool(bound) and all(op in operations for op in bound) and not any(operations[op] for op in bound)
            if not total:
                text = "not implemented" if lacks else "—"
            elif state == "failed":
                text = f"✗ {counts['failed']} failed / {total}"
            elif state == "deviation":
                text = f"~ {counts['deviation']} dev. / {total}"
            elif state == "passed":
                text = f"✓ {counts['passed']}" + (f" / {total}" if total != counts["passed"] else "")
            else:
                text = f"{total} unsupported"
            lines = [f"{cid} on {name}: {_counts_text(counts)}"]
            if lacks:
                lines.append(f"{name} exposes none of {', '.join(binds[cid])}, the operation(s) this clause binds")
            per = defaultdict(Counter)
            for (device, dtype, status), n in detail.get((cid, name), Counter()).items():
                per[(device, dtype)][status] += n
            for (device, dtype) in sorted(per, key=lambda k: (str(k[0]), _dtype_key(str(k[1])))):
                lines.append(f"  {device}/{dtype}: {_counts_text(per[(device, dtype)])}")
            row.append(f'<td class="cell" style="background:{bg};color:{fg}" title="{e(chr(10).join(lines))}">'
                       f"{e(text)}</td>")
        body.append("<tr>" + "".join(row) + "</tr>")
    legend = "".join(f'<span style="background:{STATUS_COLOURS[s][0]};color:{STATUS_COLOURS[s][1]}">{label}</span>'
                     for s, label in (("passed", "all passed"), ("failed", "any failed"),
                                      ("deviation", "declared deviation, none failed"),
                                      ("unsupported", "only unsupported"), ("none", "no case")))
    return ("<h2>Clauses × implementations</h2>"
            f'<p class="legend">{legend}</p>'
            '<p class="note">Rows are the clauses of spec/clauses.yaml (hover a clause for its statement); '
            "each cell counts the judged cases naming that clause. Hover a cell for counts per device and dtype. "
            "A case is credited to the one clause it was judged under, so a dash means no case was attributed to "
            "the clause in this run, not that it was violated; <i>not implemented</i>: the implementation exposes "
            "none of the operations the clause binds.</p>"
            f'<table class="matrix"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>')


def _agreement(report: dict) -> str:
    rows = report.get("agreement") or []
    out = ["<h2>Cross-backend agreement</h2>"]
    if not rows:
        out.append('<p class="note">No pairs to compare: agreement needs two or more implementation × device '
                   "combinations that ran the same fixture cases in the same dtype.</p>")
        return "".join(out)
    out.append('<p class="note">Each cell: max abs difference / max ULP distance in that dtype, over the fixture '
               "cases both ran (hover for the count). Non-finite elements are left out.</p>")
    by_dtype: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_dtype[row.get("dtype")].append(row)
    for dtype in sorted(by_dtype, key=lambda d: _dtype_key(str(d))):
        pairs = by_dtype[dtype]
        endpoints = sorted({r.get("a") for r in pairs} | {r.get("b") for r in pairs})
        lookup = {}
        for r in pairs:
            lookup[(r.get("a"), r.get("b"))] = lookup[(r.get("b"), r.get("a"))] = r
        head = "<th></th>" + "".join(f"<th>{e(x)}</th>" for x in endpoints)
        body = []
        for left in endpoints:
            tds = [f"<th>{e(left)}</th>"]
            for right in endpoints:
                r = lookup.get((left, right))
                if left == right:
                    tds.append('<td class="num note">·</td>')
                elif r is None:
                    tds.append('<td class="num note" title="no shared cases">—</td>')
                else:
                    tds.append(f'<td class="num" title="{e(r.get("cases"))} shared cases">'
                               f"{e(fmt(r.get('max_abs_diff')))} / {e(r.get('max_ulp'))} ulp</td>")
            body.append("<tr>" + "".join(tds) + "</tr>")
        out.append(f"<h3>{e(dtype)}</h3><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    return "".join(out)


JUDGED = ("passed", "deviation", "failed")


DTYPE_COLOURS = {"float64": "#1f77b4", "float32": "#2ca02c", "float16": "#ff7f0e", "bfloat16": "#9467bd"}


STATUS_MARKERS = {"passed": ("o", 12), "deviation": ("D", 18), "failed": ("X", 34)}


def plot_points(cases: list[dict]) -> tuple[list[dict], int, int]:
    """The points of the ratio plot: one per judged case, with its worst ratio error / allowed error.

    Returns (points, infinite, without): each point is {implementation, dtype, status,
    ratio}, the ratio the verdict compared with 1 at the case's worst element (the
    JSON's ``ratio``; a record without it but with ``allowed`` 0 and an error is an
    error where nothing is allowed, ratio inf). ``infinite`` counts those; ``without``
    the judged cases with no figures at all (a wrong shape, an exception, a
    non-finite output: their verdict is not a tolerance comparison).
    """
    points, infinite, without = [], 0, 0
    for c in cases:
        if c.get("status") not in JUDGED:
            continue
        ratio = c.get("ratio")
        if ratio is None:
            if c.get("allowed") == 0 and (c.get("max_abs_error") or 0) > 0:
                ratio, infinite = math.inf, infinite + 1
            else:
                without += 1
                continue
        points.append({"implementation": str(c.get("implementation")), "dtype": str(c.get("dtype")),
                       "status": c.get("status"), "ratio": float(ratio)})
    return points, infinite, without


def _ratio_groups(points: list[dict]) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p in points:
        groups[(p["implementation"], p["dtype"])].append(p)
    return groups


def _ratio_table(points: list[dict], names: list[str]) -> str:
    """The plot's figures as a table (per implementation and dtype): shown when matplotlib is absent."""
    groups = _ratio_groups(points)
    rows = []
    for name in names:
        for dtype in sorted({d for (n, d) in groups if n == name}, key=_dtype_key):
            ratios = sorted(p["ratio"] for p in groups[(name, dtype)])
            above = sum(r > 1 for r in ratios)
            above_html = f'<b style="color:{PLOT_COLOURS["failed"]}">{above}</b>' if above else "0"
            rows.append([e(name), e(dtype), str(len(ratios)), e(fmt(ratios[len(ratios) // 2])),
                         e(fmt(ratios[-1])), above_html])
    return table_html(["implementation", "dtype", "cases", "median ratio", "worst ratio", "above 1"], rows,
                  "ratios", numeric=[2, 3, 4, 5])


def _plot(cases: list[dict], names: list[str]) -> str:
    out = ["<h2>Error relative to the allowed error</h2>"]
    points, infinite, without = plot_points(cases)
    if not points:
        out.append('<p class="note">No judged case carries an error/allowed ratio.</p>')
        return "".join(out)
    names = [n for n in names if any(p["implementation"] == n for p in points)] + sorted(
        {p["implementation"] for p in points} - set(names))
    note = ("One point per judged case: its worst ratio error / allowed error, taken at one element as the verdict "
            "takes it (the JSON's <code>ratio</code>). A case fails its value comparison when the ratio is above 1, "
            "the line marked <i>allowed</i>; so failed cases sit above it and passed ones at or below it "
            "(a declared deviation may sit on either side).")
    extra = []
    if infinite:
        extra.append(f"{infinite} case(s) with an error where nothing is allowed (ratio infinite) are drawn on "
                     "the top edge.")
    if without:
        extra.append(f"{without} judged case(s) carry no ratio (a wrong shape, an exception, a non-finite output: "
                     "a verdict that is not a tolerance comparison) and are not drawn.")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        out.append('<p class="note">matplotlib is not installed, so the plot is left out '
                   '(<code>pip install matplotlib</code> or the <code>report</code> extra adds it); its figures '
                   "follow as a table.</p>")
        out.append(_ratio_table(points, names))
        out.append(f'<p class="note">{note} {e(" ".join(extra))}</p>')
        return "".join(out)
    try:
        image, notes = _render_plot(points, names, Figure, FigureCanvasAgg)
    except Exception as exc:  # a plot must never cost the report
        out.append(f'<p class="note">The plot could not be drawn ({e(type(exc).__name__)}: {e(exc)}); '
                   "its figures follow as a table.</p>")
        out.append(_ratio_table(points, names))
        return "".join(out)
    out.append(f'<img class="plot" alt="error / allowed error per case on a log axis, per implementation and dtype; '
               f'the line at 1 is the allowed error" src="data:image/png;base64,{image}">')
    out.append(f'<p class="note">{note} Colour: dtype; marker: status; x: implementation, one column per dtype. '
               + e(" ".join(extra + notes)) + "</p>")
    out.append(f"<details><summary>the same figures as a table</summary>{_ratio_table(points, names)}</details>")
    return "".join(out)


def _render_plot(points: list[dict], names: list[str], Figure, FigureCanvasAgg) -> tuple[str, list[str]]:
    groups = _ratio_groups(points)
    dtypes = sorted({p["dtype"] for p in points}, key=_dtype_key)
    finite = [p["ratio"] for p in points if math.isfinite(p["ratio"])]
    positive = [r for r in finite if r > 0]
    # Exact results (ratio 0) and ratios far below the rest sit on a floor line a decade under the
    # smallest positive ratio, at most 12 decades below 1, so the axis stays readable.
    floor = max(min(positive) / 10.0, 1e-12) if positive else 1e-3
    # ... and ratios past 12 decades above it (an error where the allowance is the dtype's rounding near 0: 1e306
    # broke the log axis) on the top line with the infinite ones.
    ceiling = 1e12
    top = min(max([r for r in finite] + [10.0]) * 10.0, ceiling)
    high = sum(r > top for r in finite)
    width = min(24.0, max(7.0, 1.1 * len(names) + 2.5))
    fig = Figure(figsize=(width, 5.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    rng = random.Random(0)  # the same jitter every time: pages of the same run are identical
    slot = 0.8 / max(1, len(dtypes))
    low = 0
    notes: list[str] = []
    labelled: set = set()
    for index, name in enumerate(names):
        for d_index, dtype in enumerate(dtypes):
            centre = index - 0.4 + slot * (d_index + 0.5)
            for status in JUDGED:
                ratios = [p["ratio"] for p in groups.get((name, dtype), []) if p["status"] == status]
                if not ratios:
                    continue
                ys = [min(max(r, floor), top) for r in ratios]
                low += sum(r < floor for r in ratios)
                xs = [centre + rng.uniform(-0.35, 0.35) * slot for _ in ys]
                marker, size = STATUS_MARKERS[status]
                colour = DTYPE_COLOURS.get(dtype, "#555555")
                ax.scatter(xs, ys, s=size, marker=marker, color=colour, alpha=0.7,
                           edgecolors="black" if status == "failed" else "none", linewidths=0.4)
                labelled.add((dtype, status))
    ax.axhline(1.0, color="#c62828", linewidth=1.2, linestyle="--")
    ax.text(0.995, 1.0, "allowed (ratio 1) ", transform=ax.get_yaxis_transform(), color="#c62828", fontsize=9,
            va="bottom", ha="right", bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=1))
    if low:
        ax.axhline(floor, color="#bbbbbb", linewidth=0.8, linestyle=":")
        notes.append(f"{low} case(s) with a ratio below {floor:.1e} (exact results included) are drawn on the "
                     "dotted floor line.")
    if high:
        notes.append(f"{high} case(s) with a ratio above {top:.0e} are drawn on the top edge.")
    ax.set_yscale("log")
    # The allowed line (ratio 1) always in view: with every ratio far above it, its label had been drawn below the
    # axes, and the layout could not make room for it (matplotlib warned "Tight layout not applied").
    ax.set_ylim(min(floor / 2.0, 0.5), max(top * 2.0, 2.0))
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30 if len(names) > 4 else 0, ha="right" if len(names) > 4 else "center",
                       fontsize=8)
    for index in range(1, len(names)):
        ax.axvline(index - 0.5, color="#e0e0e0", linewidth=0.8)
    ax.set_ylabel("worst error / allowed error (per case)")
    ax.grid(True, axis="y", which="major", alpha=0.3)
    handles = [ax.scatter([], [], s=30, marker="s", color=DTYPE_COLOURS.get(d, "#555555"), label=d) for d in dtypes]
    handles += [ax.scatter([], [], s=STATUS_MARKERS[s][1] + 10, marker=STATUS_MARKERS[s][0], color="#777777",
                           edgecolors="black" if s == "failed" else "none", label=s)
                for s in JUDGED if any(st == s for (_, st) in labelled)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.04, 1.0), fontsize=8, frameon=False)
    buffer = io.BytesIO()
    # The saved image grows to hold the rotated names and the legend (fig.tight_layout() shrinks the axes instead, and
    # warns into the user's run where it cannot).
    fig.savefig(buffer, format="png", bbox_inches="tight", pad_inches=0.15)
    return base64.b64encode(buffer.getvalue()).decode("ascii"), notes


def split_message(message: str) -> tuple[str, str, str]:
    """A failure message as (its problem line, its worst-element line, the repro command or "")."""
    from attention_conformance.conformance.judging.records import REPRO_HEADING, REPRO_LEFT_OUT

    problem = worst = ""
    lines = message.split("\n")
    repro = ""
    for index, line in enumerate(lines):
        text = line.strip()
        if text.startswith("problem ") and not problem:
            problem = text.removeprefix("problem").strip()
        elif text.startswith("worst ") and not worst:
            worst = text.removeprefix("worst").strip()
        elif text == REPRO_HEADING:
            repro = "\n".join(lines[index:])
            break
        elif text == REPRO_LEFT_OUT:
            break
    return problem or (lines[0] if lines else ""), worst, repro


def _test_function(test: str | None) -> str:
    """``conformance/test_x.py::test_y[params]`` -> ``test_y``."""
    return (test or "").rsplit("::", 1)[-1].split("[", 1)[0]


def _failures(cases: list[dict]) -> str:
    failed = [c for c in cases if c.get("status") == "failed"]
    out = ["<h2>Failures</h2>"]
    if not failed:
        out.append('<p><span class="badge ok">none</span> No judged case failed.</p>')
        return "".join(out)
    # Hypothesis records every failing example it tries while shrinking and replays the smallest last, so
    # one group per (implementation, test, clause, device, dtype) keeps the last record and counts the rest.
    groups: dict[tuple, list[dict]] = {}
    for c in failed:
        key = (c.get("implementation"), c.get("test"), c.get("clause"), c.get("op"), c.get("device"), c.get("dtype"))
        groups.setdefault(key, []).append(c)
    keys = sorted(groups, key=lambda k: tuple(str(x) for x in k))
    out.append(f'<p>{len(failed)} failed case record(s) in {len(groups)} group(s) (implementation × test × clause × '
               "device × dtype). Each row is the last record of its group — for a Hypothesis property, the "
               "shrunk example it reported: its case, the problem, the worst element and the ratio error / allowed "
               "there. Open <i>message and repro</i> for the whole verdict and the command that replays it.</p>")
    rows = []
    for key in keys[:MAX_FAILURE_GROUPS]:
        records = groups[key]
        last = records[-1]
        impl, test, clause, op, device, dtype = key
        message = last.get("message") or "(no message)"
        problem, worst, repro = split_message(message)
        ratio = last.get("ratio")
        if ratio is None and last.get("allowed") == 0 and (last.get("max_abs_error") or 0) > 0:
            ratio = math.inf
        shapes = last.get("shapes") or ""
        if isinstance(shapes, dict):  # schema version 1 wrote a dict
            shapes = ", ".join(f"{k}{tuple(v)}" for k, v in shapes.items())
        verdict = message[: len(message) - len(repro)].rstrip("\n") if repro else message
        folded = (f"<details><summary>message{' and repro' if repro else ''}</summary><pre>{e(verdict)}</pre>"
                  + (f'<pre class="repro">{e(repro)}</pre>' if repro else "") + "</details>")
        rows.append([
            f"<b>{e(impl)}</b><br>{e(device)}/{e(dtype)}",
            f'<a href="#clause-{e(clause)}"><code>{e(clause)}</code></a><br>'
            # The function's name: its parameters (implementation, device, dtype) are in the first column.
            f'<span class="note" title="{e(test)}">{e(_test_function(test) or "property test")} ({e(op)})</span>',
            f'<span class="mono">{e(last.get("case"))}</span><br><span class="note">{e(shapes)}</span>',
            f"{e(problem)}" + (f'<br><span class="mono">{e(worst)}</span>' if worst else ""),
            e(fmt(ratio)) if ratio is not None else "—",
            str(len(records)),
            folded,
        ])
    out.append(table_html(["implementation", "clause / test", "case", "problem / worst element", "ratio", "records",
                       ""], rows, "failures", numeric=[4, 5]))
    if len(keys) > MAX_FAILURE_GROUPS:
        out.append(f'<p class="note">{len(keys) - MAX_FAILURE_GROUPS} more group(s) are in the JSON report.</p>')
    return "".join(out)


def _other_outcomes(cases: list[dict]) -> str:
    """Deviations and unsupported cases, grouped by their reason."""
    grouped: Counter = Counter()
    for c in cases:
        if c.get("status") in ("deviation", "unsupported", "skipped"):
            grouped[(c.get("implementation"), c.get("status"), c.get("clause"), c.get("message") or "")] += 1
    if not grouped:
        return ""
    rows = [[e(impl), e(status), f"<code>{e(clause)}</code>", f"<pre>{e(message)}</pre>", str(n)]
            for (impl, status, clause, message), n in sorted(grouped.items(), key=lambda kv: tuple(map(str, kv[0])))]
    return ("<h2>Deviations and unsupported cases</h2>"
            + table_html(["implementation", "status", "clause", "reason", "cases"], rows, numeric=[4]))


def baseline_section(result: dict | None) -> str:
    """--baseline: the cells that changed since the earlier report (conformance/reporting/baseline.py), newly broken
    first."""
    if not result:
        return ""
    suite = result.get("suite") or {}
    out = ["<h2>Compared with the baseline</h2>",
           f'<p>Baseline <span class="mono">{e(result.get("source"))}</span>, written by suite '
           f'{e(suite.get("version"))} <span class="mono">{e((suite.get("commit") or "")[:10])}</span>'
           + (" (the spec differs: clauses, tolerances or fixtures changed)"
              if result.get("same_spec") is False else "")
           + ".</p>"]
    if result.get("no_change"):
        out.append('<p><span class="badge ok">no change</span> Nothing newly broken or fixed, no deviation added or '
                   "gone.</p>")
    several = len(result.get("environments") or []) > 1
    kinds = (("Newly broken", "newly_broken", "failed"), ("Fixed", "fixed", "failed"),
             ("Deviations added", "deviations_added", "deviation"), ("Deviations gone", "deviations_gone", "deviation"))
    for title, kind, count in kinds:
        rows = result.get(kind) or []
        if not rows:
            continue
        out.append(f"<h3>{title} ({len(rows)})</h3>")
        out.append(table_html(
            (["environment"] if several else []) + ["implementation", "device", "clause", f"{count} now / judged",
                                                     f"{count} before / judged"],
            [([e(r["environment"])] if several else []) + [
                e(r["implementation"]), e(r["device"]), f'<code>{e(r["clause"])}</code>',
                f"{e(r[count])} / {e(r['judged'])}",
                f"{e(r['baseline'][count])} / {e(r['baseline']['judged'])}" if r.get("baseline") else "not judged"]
             for r in rows], numeric=[3 + several, 4 + several]))
    changes = [f"{e(env['environment'])}: {e(change)}" for env in result.get("environments") or []
               for change in env.get("changes") or []]
    notes = [f"Cells judged only in this run: {e(result.get('judged_only_now', 0))}; only in the baseline: "
             f"{e(result.get('judged_only_before', 0))}."]
    if changes:
        notes.append("Changed since the baseline: " + "; ".join(changes) + ".")
    return "".join(out) + "".join(f'<p class="note">{note}</p>' for note in notes)


# --------------------------------------------------------------------------- entry point
def render(report: dict, path: Path) -> str:
    """The page as a string (``write`` saves it)."""
    path = Path(path)
    cases = list(report.get("cases") or [])
    counts: dict[str, Counter] = {  # summary entries also carry cases, judged and unsupported_reasons
        name: Counter({s: n for s, n in c.items() if s in STATUSES and isinstance(n, int)})
        for name, c in (report.get("summary") or {}).items()
    }
    names = [d.get("name") for d in report.get("implementations") or []]
    for c in cases:
        if c.get("implementation") not in names:
            names.append(c.get("implementation"))
    for name in counts:
        if name not in names:
            names.append(name)
    exit_status = report.get("exit_status")
    title = f"attention-conformance — exit {exit_status} — {', '.join(str(n) for n in names)}"
    sections = [
        _header(report, path),
        baseline_section(report.get("baseline")),
        _environment(report),
        _implementations(report, counts, names),
        _matrix(cases, names, {d.get("name"): d for d in report.get("implementations") or []}),
        _agreement(report),
        _plot(cases, names),
        _failures(cases),
        _other_outcomes(cases),
    ]
    return page(title, sections)


def page(title: str, sections: list[str]) -> str:
    """A self-contained page: the sections (already HTML) under the inline CSS (merged_html.py's page too)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{e(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n")


def save(text: str, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write(report: dict, path: Path) -> None:
    """Write the self-contained HTML page for ``report`` (the dict of json_report.build_report) to ``path``."""
    save(render(report, Path(path)), path)

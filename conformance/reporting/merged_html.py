"""The HTML page of a merged report (conformance/reporting/merge.py): one self-contained file, as html_report.py's for
one run.

Top to bottom: what was merged (reports, environments, whether the whole is complete, the coverage lines), the
baseline comparison when there is one, the matrix (a row per clause; a column per implementation x device x
environment, so runners of different environments stand side by side, never summed), and the failures: one row per
failing cell, which its matrix cell links to, listing the cell's failed cases with the problem, the worst element
and the message and repro folded.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from attention_conformance.conformance.reporting.html_report import (
    EXIT_MEANINGS,
    MAX_FAILURE_GROUPS,
    STATUS_COLOURS,
    table_html,
    baseline_section,
    cell_status,
    clause_ids,
    e,
    fmt,
    page,
    save,
    split_message,
)

CASES_PER_FAILURE_ROW = 5  # failed cases listed per cell; the JSON has them all (matrix[].failures)


def anchor(cell: dict) -> str:
    return "fail-" + "-".join(str(cell[k]) for k in ("environment", "implementation", "device", "clause"))


def _header(merged: dict) -> str:
    status = merged.get("exit_status")
    rows = [
        ("reports", f"{len(merged['runs'])} merged into {len(merged['environments'])} environment(s)"),
        ("suite", f"{e(merged['suite'].get('version'))} "
                  f'<span class="mono">{e(merged["suite"].get("commit") or "")}</span>'),
        ("highest exit status", f'<span class="badge {"ok" if status == 0 else "bad"}">{e(status)}</span> '
                                f"{e(EXIT_MEANINGS.get(status, 'unknown'))}"),
        ("complete", "yes: every run went to its end and every shard is here" if merged.get("complete") else
         f'<span class="badge bad">no</span> {e(merged.get("incomplete_reason"))}'),
    ]
    coverage = merged.get("coverage") or []
    if coverage:
        where = {"merge": "applied by the merge", "run": "in the run"}
        rows.append(("coverage", "<br>".join(f"{e(c['environment'])}: {e(c['line'])} ({where[c['applied_by']]})"
                                             for c in coverage)))
    meta = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<h1>attention-conformance merged report</h1><table class="meta">{meta}</table>'


def _environments(merged: dict) -> str:
    rows = []
    for env_id, env in merged["environments"].items():
        runs = [run for run in merged["runs"] if run["environment"] == env_id]
        sources = "<br>".join(
            f'<span class="mono">{e(run["source"])}</span>'
            + (f" shard {e(run['shard']['index'])}/{e(run['shard']['count'])}" if run.get("shard") else "")
            + f" exit {e(run['exit_status'])}" + ("" if run["complete"] else " <b>incomplete</b>") for run in runs)
        devices = (env.get("environment") or {}).get("devices") or {}
        device_text = "; ".join(f"{k}: {', '.join(v) if isinstance(v, list) else v}" for k, v in devices.items())
        rows.append([f"<b>{e(env_id)}</b>", e(env["description"]), e(device_text), sources,
                     "yes" if env["complete"]
                     else f'<span class="badge bad">no</span> {e(env.get("incomplete_reason"))}'])
    return ("<h2>Environments</h2>" + table_html(["", "environment", "devices", "reports", "complete"], rows)
            + '<p class="note">Runs with the same label, Python, OS, installed framework versions and accelerators '
              "are one environment (a case both judged counts once); the shards of a split run are one run.</p>")


def _matrix(merged: dict) -> str:
    cells = {(c["environment"], c["implementation"], c["device"], c["clause"]): c for c in merged["matrix"]}
    columns = sorted({(impl, device, env) for env, impl, device, _ in cells})
    flat_cases = [case for cases in merged["cases"].values() for case in cases]
    ids, statements, _ = clause_ids(flat_cases)
    by_impl: dict[str, int] = defaultdict(int)
    for impl, _, _ in columns:
        by_impl[impl] += 1
    head = ('<tr><th rowspan="2">clause</th>' + "".join(f'<th class="impl" colspan="{n}">{e(impl)}</th>'
                                                        for impl, n in by_impl.items()) + "</tr><tr>"
            + "".join(f'<th class="impl" title="{e(merged["environments"][env]["description"])}">'
                      f"{e(device)} · {e(env)}</th>" for _, device, env in columns) + "</tr>")
    body = []
    for cid in ids:
        statement = statements.get(cid, "not in spec/clauses.yaml")
        row = [f'<th class="clause" title="{e(statement)}"><code>{e(cid)}</code></th>']
        for impl, device, env in columns:
            cell = cells.get((env, impl, device, cid))
            counts = {k: cell[k] for k in ("passed", "failed", "deviation", "unsupported")} if cell else {}
            state = cell_status(counts)
            bg, fg = STATUS_COLOURS[state]
            if not cell:
                text = "—"
            elif cell["failed"]:
                text = f'<a href="#{e(anchor(cell))}">✗ {cell["failed"]} failed / {cell["judged"]}</a>'
            elif cell["deviation"]:
                text = f"~ {cell['deviation']} dev. / {cell['judged']}"
            elif cell["judged"]:
                text = f"✓ {cell['passed']}"
            else:
                text = f"{cell['unsupported']} unsupported"
            title = (f"{cid} on {impl} {device} {env}: " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
                     if cell else f"no case of {cid} on {impl} {device} {env}")
            row.append(f'<td class="cell" style="background:{bg};color:{fg}" title="{e(title)}">{text}</td>')
        body.append("<tr>" + "".join(row) + "</tr>")
    return ("<h2>Clauses × implementation × device × environment</h2>"
            '<p class="note">Each cell counts the cases judged under the clause on that implementation, device and '
            "environment; a failing cell links to its failures below. Hover a column heading for its environment.</p>"
            f'<table class="matrix"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table>')


def _failures(merged: dict) -> str:
    failing = [cell for cell in merged["matrix"] if cell["failed"]]
    out = ["<h2>Failures</h2>"]
    if not failing:
        out.append('<p><span class="badge ok">none</span> No judged case failed in any environment.</p>')
        return "".join(out)
    rows = []
    for cell in failing[:MAX_FAILURE_GROUPS]:
        cases = [merged["cases"][cell["environment"]][i] for i in cell["failures"]]
        listed = "".join(
            f'<div><span class="mono">{e(c.get("dtype"))} {e(c.get("case"))}</span>: '
            f"{e(split_message(c.get('message') or '')[0])} (ratio {e(fmt(c.get('ratio')))})</div>"
            for c in cases[:CASES_PER_FAILURE_ROW])
        if len(cases) > CASES_PER_FAILURE_ROW:
            listed += f'<div class="note">{len(cases) - CASES_PER_FAILURE_ROW} more in the JSON report</div>'
        with_repro = next((c for c in reversed(cases) if split_message(c.get("message") or "")[2]), cases[-1])
        folded = f"<details><summary>message and repro</summary><pre>{e(with_repro.get('message'))}</pre></details>"
        rows.append([f'<span id="{e(anchor(cell))}"><b>{e(cell["implementation"])}</b></span><br>'
                     f"{e(cell['device'])} · {e(cell['environment'])}",
                     f"<code>{e(cell['clause'])}</code>", f"{cell['failed']} / {cell['judged']}", listed + folded])
    out.append(table_html(["implementation", "clause", "failed / judged", "failed cases"], rows, "failures",
                          numeric=[2]))
    if len(failing) > MAX_FAILURE_GROUPS:
        out.append(f'<p class="note">{len(failing) - MAX_FAILURE_GROUPS} more failing cells are in the JSON '
                   "report.</p>")
    return "".join(out)


def render(merged: dict) -> str:
    sections = [_header(merged), baseline_section(merged.get("baseline")), _environments(merged), _matrix(merged),
                _failures(merged)]
    return page(f"attention-conformance — merged: {len(merged['runs'])} reports, "
                f"{len(merged['environments'])} environments", sections)


def write(merged: dict, path: Path) -> None:
    save(render(merged), path)

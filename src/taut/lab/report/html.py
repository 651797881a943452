"""The self-contained `report.html`: inline CSS, figures embedded as base64 PNG data URIs."""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path
from typing import Any

from taut.lab.report.figures import Drawn, Omitted
from taut.lab.report.summary import COLUMNS, EFFICIENCY, best_rows, formatted

CSS = """
:root { --ink: #1f2328; --muted: #5f6b7a; --line: #e3e6ea; --card: #ffffff; --bg: #f5f6f8; --best: #e8f4ee; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
       font: 15px/1.5 -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1200px; margin: 0 auto; padding: 28px 28px 48px; }
header h1 { font-size: 26px; margin: 0 0 4px; letter-spacing: -0.01em; }
header p { margin: 0; color: var(--muted); }
section { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 20px 24px;
          margin-top: 22px; box-shadow: 0 1px 2px rgba(0,0,0,0.03); }
h2 { font-size: 18px; margin: 0 0 6px; }
p.caption { color: var(--muted); margin: 0 0 14px; max-width: 900px; }
figure { margin: 0; }
figure img { display: block; width: 100%; height: auto; margin: 0 auto; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 14px; font-variant-numeric: tabular-nums; }
th, td { padding: 7px 10px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { text-align: right; font-weight: 600; color: var(--muted); font-size: 12.5px; vertical-align: bottom;
     white-space: normal; min-width: 70px; }
th:first-child, td:first-child { text-align: left; }
td { text-align: right; }
tbody tr:hover { background: #fafbfc; }
td.best { background: var(--best); font-weight: 600; }
.swatch { display: inline-block; width: 11px; height: 11px; border-radius: 3px; margin-right: 8px; vertical-align: -1px; }
.sub { display: block; color: var(--muted); font-size: 12px; }
dl.runs { display: grid; grid-template-columns: max-content 1fr; gap: 4px 18px; margin: 12px 0 0; font-size: 13px; }
dl.runs dt { font-weight: 600; }
dl.runs dd { margin: 0; color: var(--muted); overflow-wrap: anywhere; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
section.omitted { padding: 14px 24px; }
section.omitted h2 { font-size: 16px; color: var(--muted); }
section.omitted p.caption { margin: 0; }
footer { color: var(--muted); font-size: 13px; margin-top: 22px; }
p.headline { font-size: 16px; margin: 4px 0 12px; }
h3 { font-size: 15px; margin: 20px 0 4px; }
td.text, th.text { text-align: left; }
"""


def render(title: str, runs: list[dict[str, Any]], rows: list[dict[str, Any]], figures: list[Drawn | Omitted],
           images: dict[str, Path]) -> str:
    """The page: run list, summary table, then every figure with its caption."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body><main>",
        "<header>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(runs)} run{'s' if len(runs) != 1 else ''} · generated {time.strftime('%Y-%m-%d %H:%M')} by "
        "<code>taut compare</code></p>",
        "</header>",
        _summary(runs, rows),
    ]
    for d in figures:
        if isinstance(d, Omitted):
            parts.append(f'<section id="{d.name}" class="omitted"><h2>{html.escape(d.title)}</h2>'
                         f'<p class="caption">Not drawn: {_code(d.reason)}</p></section>')
            continue
        parts += [
            f'<section id="{d.name}"><h2>{html.escape(d.title)}</h2>',
            f'<p class="caption">{html.escape(d.caption)}</p>',
            f'<figure><img alt="{html.escape(d.title)}" src="{data_uri(images[d.name])}"'
            f' style="max-width:{round(d.figure.get_figwidth() * 110)}px"></figure>',
            "</section>",
        ]
    parts += [
        "<footer>Accuracy is the mean over all sampled responses; tokens are response tokens (prompt excluded). "
        "The plotted numbers are in <code>report.json</code> next to this page; the metrics are defined in "
        "<code>docs/evaluation.md</code>.</footer>",
        "</main></body></html>",
    ]
    return "\n".join(parts)


def _summary(runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    columns = COLUMNS + EFFICIENCY
    head = "".join(f'<th title="{html.escape(c.help)}">{html.escape(c.header)}</th>' for c in columns)
    best = {c.key: best_rows(rows, c) for c in columns}
    body = []
    for i, (run, row) in enumerate(zip(runs, rows)):
        cells = "".join(
            f'<td{" class=best" if i in best[c.key] else ""}>{html.escape(formatted(row, c))}</td>' for c in columns)
        over = f'<span class="sub">Δ: {html.escape(row["change_over"])}</span>' if row["change_over"] else ""
        name = (f'<span class="swatch" style="background:{run["color"]}"></span>{html.escape(row["label"])}'
                f'<span class="sub">{html.escape(row["chosen"])}'
                f'{" (selected)" if row["selected"] == row["chosen"] else ""}</span>{over}')
        body.append(f"<tr><td>{name}</td>{cells}</tr>")
    details = "".join(
        f"<dt><span class=\"swatch\" style=\"background:{run['color']}\"></span>{html.escape(row['label'])}</dt>"
        f"<dd><code>{html.escape(row['run_dir'])}</code> · strategy {html.escape(str(row['strategy'] or '–'))} · "
        f"{row['evaluations']} evaluated checkpoint{'s' if row['evaluations'] != 1 else ''} "
        f"({html.escape(row['first'])} … {html.escape(row['chosen'])})</dd>"
        for run, row in zip(runs, rows))
    return (
        '<section id="summary"><h2>Side by side</h2>'
        + "".join(_headline(run, row) for run, row in zip(runs, rows))
        + '<p class="caption">Each run at its chosen checkpoint (the one its curriculum selected, else its latest '
        "evaluated). Δ columns show the change its headline phase made — a curriculum's compression phase against "
        "the phase before it; a run without phases against its first evaluated checkpoint; pp = percentage points. "
        "Highlighted: the best value in each column.</p>"
        f'<div class="table-wrap"><table><thead><tr><th>run</th>{head}</tr></thead>'
        f'<tbody>{"".join(body)}</tbody></table></div>'
        + _phases_table(runs, rows)
        + f'<dl class="runs">{details}</dl></section>'
    )


def _headline(run: dict[str, Any], row: dict[str, Any]) -> str:
    """One sentence: what the run's headline phase did to length and accuracy."""
    h = row["headline"]
    if not h:
        return ""
    return (f'<p class="headline"><span class="swatch" style="background:{run["color"]}"></span>'
            f'<b>{html.escape(row["label"])}</b> — {html.escape(h["over"])}: tokens {h["tokens_before"]:.1f} → '
            f'{h["tokens_mean"]:.1f} (<b>{h["tokens_change_pct"]:+.1f}%</b>), accuracy {100 * h["accuracy_before"]:.1f}% → '
            f'{100 * h["accuracy"]:.1f}% (<b>{h["accuracy_change_pp"]:+.1f}pp</b>)</p>')


def _phases_table(runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """Per curriculum phase, its change against the phase before it (runs with evaluated phases)."""
    body = []
    for run, row in zip(runs, rows):
        for p in row["phases"] if len(row["phases"]) > 1 else []:
            body.append(
                f'<tr><td><span class="swatch" style="background:{run["color"]}"></span>{html.escape(row["label"])}</td>'
                f'<td class="text">{html.escape(p["phase"])}<span class="sub">{html.escape(p["strategy"])}'
                f'{"" if p["ended_by"] == "steps" else ", stopped by " + html.escape(p["ended_by"])}</span></td>'
                f'<td>{p["start_step"]}–{p["end_step"]}</td><td>{100 * p["accuracy"]:.1f}%</td>'
                f'<td>{p["accuracy_change_pp"]:+.1f}pp</td><td>{p["tokens_mean"]:.1f}</td>'
                f'<td>{p["tokens_change_pct"]:+.1f}%</td></tr>')
    if not body:
        return ""
    return ('<h3>By phase</h3><p class="caption">Each curriculum phase against the phase before it (the first against '
            "the start), from the evaluations of the checkpoints at its two ends.</p>"
            '<div class="table-wrap"><table class="phases"><thead><tr><th>run</th><th class="text">phase</th><th>steps</th>'
            "<th>accuracy</th><th>Δ accuracy</th><th>mean tokens</th><th>Δ tokens</th></tr></thead>"
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _code(text: str) -> str:
    """Escaped text with `backticked` spans set as code."""
    pieces = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(pieces))


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")

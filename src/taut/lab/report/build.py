"""Build a report: read the runs, draw the figures, write PNGs, `report.json` and `report.html`."""

from __future__ import annotations

import json
from pathlib import Path

from taut.evaluate import finite
from taut.lab.report.efficiency import efficiency
from taut.lab.report.figures import Drawn, Omitted, draw_all, run_colors
from taut.lab.report.html import render
from taut.lab.report.runs import RunResults, load_run, unique_labels
from taut.lab.report.summary import summary_row
from taut.lab.report.transfer import transfer_by_suite

REPORT = "report.html"
DATA = "report.json"
DPI = 150


def compare(run_dirs: list[Path], out: Path, labels: list[str] | None = None) -> Path:
    """Compare runs side by side; returns the path of the written `report.html`.

    Reads every run's evaluations (`RUN/eval/step-*.json`) and training log (`metrics.jsonl`)
    and writes into `out`: one PNG per figure, `report.json` (the table and the exact data each
    figure plots) and `report.html` (self-contained: the PNGs are embedded).
    """
    if not run_dirs:
        raise ValueError("compare needs at least one run directory")
    missing = [str(d) for d in run_dirs if not Path(d).is_dir()]
    if missing:                                  # before any run's evaluations are read: name what is absent
        raise FileNotFoundError(f"no such run directory: {', '.join(missing)}")
    runs = [load_run(Path(d), label) for d, label in zip(run_dirs, unique_labels(run_dirs, labels))]
    return write_report(runs, Path(out), title="taut report: " + ", ".join(r.label for r in runs))


def write_run_report(run_dir: Path, out: Path | None = None) -> Path:
    """The report of a single run, by default in `RUN/report/`; returns the path of `report.html`."""
    run_dir = Path(run_dir)
    return compare([run_dir], out or run_dir / "report")


def write_report(runs: list[RunResults], out: Path, title: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    colors = run_colors(len(runs))
    figures = draw_all(runs, colors) + [transfer_by_suite(runs, colors)]
    drawn = [f for f in figures if isinstance(f, Drawn)]
    images = {}
    for d in drawn:
        images[d.name] = out / f"{d.name}.png"
        d.figure.savefig(images[d.name], dpi=DPI, facecolor="white")
    rows = [summary_row(run) | measures for run, measures in zip(runs, efficiency(runs))]
    run_info = [{"label": r.label, "run_dir": str(r.run_dir), "color": c} for r, c in zip(runs, colors)]
    data = {
        "runs": run_info,
        "table": rows,
        "figures": {d.name: {"file": images[d.name].name, "title": d.title, "data": d.data} for d in drawn},
        "omitted": {f.name: f.reason for f in figures if isinstance(f, Omitted)},
    }
    (out / DATA).write_text(json.dumps(finite(data), indent=1))
    path = out / REPORT
    path.write_text(render(title, run_info, rows, figures, images))
    return path

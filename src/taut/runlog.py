"""Run directories, the metrics log and the progress display."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


def default_run_dir(command: str) -> Path:
    return Path("runs") / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends one JSON object per line to `metrics.jsonl`.

    On resume, entries logged after the checkpoint being resumed from are dropped first, so
    the log reads as one uninterrupted run.
    """

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if line.strip() and _step_of(line) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif resume_step is None:
            self.path.write_text("")

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")


def _step_of(line: str) -> int:
    return int(json.loads(line).get("step", -1))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class StepProgress:
    """A rich progress bar showing the newest step's headline numbers; silent when quiet."""

    def __init__(self, total: int, description: str, quiet: bool = False, start: int = 0):
        self.quiet = quiet
        self.progress = None
        if not quiet:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                console=console, transient=False,
            )
            self.task = self.progress.add_task(description, total=total, completed=start, info="")

    def __enter__(self):
        if self.progress:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.progress.__exit__(*exc)

    def update(self, step: int, **fields: float) -> None:
        if self.progress:
            info = "  ".join(f"{k} {v:.3g}" for k, v in fields.items() if v is not None)
            self.progress.update(self.task, completed=step, info=info)

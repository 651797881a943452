"""Run directories, the metrics log and the progress display."""

from __future__ import annotations

import json
import math
import os
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

    A fresh log starts empty. On resume the log is cut back to what the checkpoint being
    resumed from covers — its first `committed` lines (the RL trainer records that count in every
    checkpoint), or the lines up to `resume_step` — so that it reads as one uninterrupted run.
    A torn last line (a kill during an append) is dropped with a warning; the cut is written
    atomically.
    """

    def __init__(self, path: Path, resume_step: int | None = None, committed: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lines = 0
        if resume_step is None and committed is None:
            self.path.write_text("")
            return
        records = _complete_lines(self.path) if self.path.exists() else []
        if committed is not None:
            if len(records) < committed:
                console.print(f"[yellow]warning: {self.path} holds {len(records)} lines, fewer than the {committed} "
                              f"its checkpoint covers; continuing after them[/yellow]")
            kept = records[:committed]
        else:
            kept = [line for line in records if _step_of(line) <= resume_step]
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)
        self.lines = len(kept)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self.lines += 1


def _complete_lines(path: Path) -> list[str]:
    """The log's lines, without a torn last one; a damaged line elsewhere is an error naming it."""
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    for number, line in enumerate(lines, 1):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                console.print(f"[yellow]warning: {path}:{number}: dropped a torn last line (the run was killed "
                              f"while writing it); its step will be redone[/yellow]")
                return lines[:-1]
            raise ValueError(f"{path}:{number}: not a JSON record; the metrics log is damaged") from None
    return lines


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

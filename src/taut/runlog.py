"""Run directories, the metrics log and the progress display."""

from __future__ import annotations

import json
import math
import os
import sys
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
    """Progress of a loop over steps, on stderr; silent when quiet.

    On a terminal: a rich bar with the newest step's numbers. Without one (nohup, a batch
    scheduler, a pipe): one plain line at the first step, then every `every_s` seconds
    (default 30; the environment variable TAUT_PROGRESS_SECONDS overrides it) and at the last
    step, with steps/s and the time left. `update(step, **fields)` takes numbers (printed with
    3 significant digits) and text (a phase name, printed as is); None is left out.
    """

    def __init__(self, total: int, description: str, quiet: bool = False, start: int = 0,
                 every_s: float | None = None, unit: str = "step"):
        self.total, self.description, self.start, self.unit = total, description, start, unit
        self.quiet = quiet
        self.progress = None
        self.plain = not quiet and not console.is_terminal
        self.every_s = float(os.environ.get("TAUT_PROGRESS_SECONDS", 30)) if every_s is None else every_s
        self.t0 = time.monotonic()
        self.last_line: float | None = None
        if not quiet and not self.plain:
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

    def update(self, step: int, **fields: float | str | None) -> None:
        if self.progress:
            self.progress.update(self.task, completed=step, info=format_fields(fields))
        elif self.plain:
            now = time.monotonic()
            if self.last_line is None or now - self.last_line >= self.every_s or step >= self.total:
                self.last_line = now
                print(self.line(step, fields, now - self.t0), file=sys.stderr, flush=True)

    def line(self, step: int, fields: dict[str, float | str | None], elapsed: float) -> str:
        """The plain progress line: `rl step 12/120  reward 0.61  … 0.42 steps/s  ETA 4m17s`."""
        done = step - self.start
        rate = done / elapsed if elapsed > 0 and done > 0 else None
        pace = f"{rate:.3g} {self.unit}s/s  ETA {_duration((self.total - step) / rate)}" if rate else "ETA –"
        return "  ".join(x for x in (f"{self.description} {self.unit} {step}/{self.total}", format_fields(fields), pace) if x)


def format_fields(fields: dict[str, float | str | None]) -> str:
    return "  ".join(f"{k} {v:.3g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in fields.items() if v is not None)


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"

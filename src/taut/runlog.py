"""Run directories, the metrics log and the progress display."""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

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
    A torn last line (a kill during an append) is dropped with a warning that says whether its
    step will be redone (the checkpoint does not cover it) or the line is lost (it does: a file
    damaged after the checkpoint was written); the cut is written atomically.
    """

    def __init__(self, path: Path, resume_step: int | None = None, committed: int | None = None,
                 forward: Callable[[dict[str, Any]], None] | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.forward = forward            # also send each record here (the experiment trackers)
        self.lines = 0
        if resume_step is None and committed is None:
            self.path.write_text("")
            return
        records, torn = _complete_lines(self.path) if self.path.exists() else ([], None)
        if torn is not None:
            # the torn line is the log's next line: redone if the checkpoint does not cover it, else lost
            step = re.search(r'"step":\s*(-?\d+)', torn)
            covered = len(records) < committed if committed is not None else step is not None and int(step[1]) <= resume_step
            where = f"{self.path}:{len(records) + 1}"
            fate = ("the checkpoint resumed from already covers its step, so the step is not redone and the line is "
                    "lost" if covered else "its step will be redone and the line written again")
            console.print(f"[yellow]warning: {where}: dropped a torn last line (the run was stopped while writing "
                          f"it, or the file was damaged); {fate}[/yellow]")
        if committed is not None:
            if len(records) < committed and not (torn is not None and len(records) + 1 == committed):
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
        if self.forward is not None:
            self.forward(record)


def _complete_lines(path: Path) -> tuple[list[str], str | None]:
    """The log's complete lines and its torn last line, if any; a damaged line elsewhere is an
    error naming it."""
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    for number, line in enumerate(lines, 1):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                return lines[:-1], line
            raise ValueError(f"{path}:{number}: not a JSON record; the metrics log is damaged") from None
    return lines, None


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

"""A run's heartbeat: the line a process killed from outside leaves behind.

The kernel's OOM killer ends a process with SIGKILL, which no handler sees: the process writes
nothing, and its run directory holds checkpoints and a metrics log that simply stop. So the
training loops keep `RUN/.taut-progress.json` — the process's PID and start time (so that a
reused PID is not taken for it), its last finished step, its peak resident memory so far
(`getrusage`'s `ru_maxrss`) and the time — rewritten at every step boundary: a few hundred bytes
written to a temporary file and renamed over the old one, no fsync (a rename is atomic against
the death of the process, which is all it has to survive). Every exit that Python sees — a
finished run, an error it reports, a signal that stops it at a step — removes the file.

A file left behind whose process is gone therefore means the process was stopped without a word:
SIGKILL (the OOM killer, `kill -9`, a scheduler's hard limit), a crash of the interpreter. The
next `taut` command on the directory (`claim_run_dir`: `train --resume`, `sft --resume`; and
`taut eval RUN`, `taut data health RUN`) prints one line saying so (`report_stopped`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from taut.runlog import console

PROGRESS_FILE = ".taut-progress.json"


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux /proc), or None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])      # field 22; the command name may hold spaces


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (ru_maxrss: kilobytes on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class Heartbeat:
    """`RUN/.taut-progress.json` while a training loop runs in `run_dir`; removed when it exits
    in any way Python sees."""

    def __init__(self, run_dir: Path, command: str):
        self.path = Path(run_dir) / PROGRESS_FILE
        self.tmp = self.path.with_name(f"{PROGRESS_FILE}.tmp-{os.getpid()}")
        self.record: dict[str, Any] = {"pid": os.getpid(), "start_ticks": _start_ticks(os.getpid()), "command": command,
                                       "step": None, "peak_rss_bytes": 0, "time": 0.0}

    def __enter__(self) -> Heartbeat:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.beat(None)
        return self

    def beat(self, step: int | None) -> None:
        """Record that `step` is finished (None: before the first step)."""
        self.record |= {"step": step, "peak_rss_bytes": peak_rss_bytes(), "time": time.time()}
        self.tmp.write_text(json.dumps(self.record))
        os.replace(self.tmp, self.path)

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)
        self.tmp.unlink(missing_ok=True)


def _alive(record: dict[str, Any]) -> bool:
    """Whether the process that wrote `record` still runs (the same PID started at the same time)."""
    pid = record["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:           # a process of another user holds the PID: not ours
        return False
    started = record.get("start_ticks")
    return started is None or _start_ticks(pid) in (None, started)


def stopped_without_a_word(run_dir: Path) -> str | None:
    """The line for a heartbeat left in `run_dir` by a process that no longer runs, else None."""
    path = Path(run_dir) / PROGRESS_FILE
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):       # no heartbeat; a target that is a file
        return None
    except ValueError:                # written by rename, never torn: damaged from outside
        return f"{path}: damaged (not valid JSON): remove it; it only records how the last process went"
    if _alive(record):
        return None
    step = record["step"]
    when = "before its first step" if step is None else f"after step {step}"
    peak = record["peak_rss_bytes"] / 1e9
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["time"]))
    return (f"{run_dir}: the previous process (PID {record['pid']}, taut {record['command']}) stopped without a word "
            f"{when}, at peak memory {peak:.1f} GB (its last heartbeat: {stamp}) — killed from outside (out of memory?); "
            f"`journalctl -k | grep -i oom` (or dmesg) names the OOM killer's victims; see docs/reliability.md, "
            f"\"Inputs that exhaust memory\"")


def report_stopped(run_dir: Path) -> None:
    """Print `stopped_without_a_word`'s line for `run_dir`, if there is one."""
    line = stopped_without_a_word(run_dir)
    if line is not None:
        from rich.markup import escape

        console.print(f"[yellow]{escape(line)}[/yellow]", highlight=False, soft_wrap=True)

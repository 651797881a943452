"""One way the lab's studies run a `taut` command: printed first (as a shell line that can be rerun
by hand), its output to a log when one is given, timed by its own wall and CPU seconds — the CPU
of that process alone, so that commands run side by side are timed apart."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


class CommandFailed(RuntimeError):
    """A taut command exited with an error; the message has its exit status and command line."""


def run_taut(*args: str, log: Path | None = None, append: bool = False) -> tuple[float, float]:
    """Run `taut ARGS…`; (wall, CPU) seconds. With `log` its output goes there (appended, after the
    command line, with `append`); a failure raises `CommandFailed`."""
    command = [str(Path(sys.executable).parent / "taut"), *args]
    line = " ".join(shlex.quote(a) for a in command)
    shown = line + (f" >{'>' if append else ''} {shlex.quote(str(log))} 2>&1" if log else "")
    print(f"$ {shown}", flush=True)          # one write: commands run side by side print whole lines
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    tick = time.perf_counter()
    with open(log, "a" if append else "w") if log else contextlib.nullcontext() as sink:
        if sink and append:
            sink.write(f"$ {line}\n")
            sink.flush()
        child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT if log else None)
        _, status, usage = os.wait4(child.pid, 0)
    if (code := os.waitstatus_to_exitcode(status)) != 0:
        raise CommandFailed(f"exit status {code} from\n  {shown}")
    return time.perf_counter() - tick, usage.ru_utime + usage.ru_stime

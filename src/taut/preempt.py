"""Stopping cleanly when a batch scheduler asks.

SLURM and Kubernetes send SIGTERM before they kill a job (at its time limit, on preemption,
when a pod is evicted), and SLURM sends SIGUSR1 ahead of the limit when asked to
(`#SBATCH --signal=USR1@120`: 120 s before). `taut train` and `taut sft` treat either as a
request to stop: the step under way finishes, its checkpoint is written, one line gives the
step and the command that continues the run, and the process exits with `EXIT_PREEMPTED` (4).
`--resume` then continues exactly as if the run had never stopped. A second signal while the
step finishes stops at once (the default action of the signal: exit 128 + its number); the
run then resumes from its previous checkpoint, as after a kill.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
EXIT_PREEMPTED = 4


class Preempted(Exception):
    """A run that stopped at a step boundary on a signal, its checkpoint written."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path, resume_command: str):
        self.signal_name, self.step, self.checkpoint, self.resume_command = signal_name, step, checkpoint, resume_command
        super().__init__(f"stopped by {signal_name} after step {step}, checkpoint {checkpoint} written; "
                         f"continue with: {resume_command}")


class StopRequest:
    """Set by the first SIGTERM or SIGUSR1; the training loop reads it at each step boundary."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def __bool__(self) -> bool:
        return self.signal_name is not None


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """While the block runs, SIGTERM and SIGUSR1 set the request instead of ending the process;
    a second one ends it at once. Outside the main thread (where handlers cannot be set) the
    request is never set and the signals keep their usual action."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handle(signum, frame):
        if request:
            for sig in SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), signum)               # the second signal: its default action, now
            return
        request.signal_name = signal.Signals(signum).name

    previous = {sig: signal.signal(sig, handle) for sig in SIGNALS}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def resume_command(command: str, run_dir: Path) -> str:
    """The command that continues `run_dir`: `taut train --resume RUN`."""
    return f"taut {command} --resume {run_dir}"

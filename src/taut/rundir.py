"""A run directory belongs to one run and one process at a time.

`claim_run_dir` is held around everything a training command does in its directory:

- A directory that already holds a run (any of `RUN_FILES`) is refused unless the command
  continues that run (`resume`) or replaces it (`overwrite`, which first removes those files —
  and only those: anything else in the directory is left alone).
- A fresh run that fails before it has anything to keep (no checkpoint, no metrics, no
  evaluation) removes the files it wrote (its config.yaml), so that the same command, corrected,
  can be run again without `--overwrite`.
- An exclusive `flock` on `RUN/.taut.lock`, which holds the owner's PID, keeps a second process
  out; it gets `RunDirBusy` naming that PID. The kernel releases the lock when the holder exits
  or dies, so a killed run never leaves a stale lock behind. The lock file itself stays (an
  unlinked lock file would let a third process lock a different inode).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from taut.heartbeat import report_stopped

LOCK_FILE = ".taut.lock"
RUN_FILES = ("config.yaml", "metrics.jsonl", "checkpoints", "curriculum.json", "selection.json", "eval", "report")


class RunDirError(RuntimeError):
    """A run directory that cannot be used as asked; the message says what to do."""


class RunDirBusy(RunDirError):
    """Another live process holds the run directory's lock."""


def run_files(run_dir: Path) -> list[str]:
    """The files and directories of a previous run found in `run_dir`."""
    return [name for name in RUN_FILES if (Path(run_dir) / name).exists()]


def _has_results(run_dir: Path) -> bool:
    """Whether a run wrote anything worth keeping: a checkpoint, a metrics line, an evaluation."""
    for name in RUN_FILES:
        path = run_dir / name
        if name == "config.yaml" or not path.exists():
            continue
        if name == "checkpoints" and path.is_dir():
            if any(not p.name.startswith(".tmp") for p in path.iterdir()):
                return True
        elif not path.is_file() or path.stat().st_size > 0:
            return True
    return False


def _forget_empty_run(run_dir: Path) -> None:
    """Remove what a failed fresh start wrote, when it wrote nothing worth keeping."""
    if _has_results(run_dir):
        return
    for name in run_files(run_dir):
        path = run_dir / name
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)


@contextmanager
def claim_run_dir(run_dir: Path, *, resume: bool, overwrite: bool, resumable: bool = True) -> Iterator[Path]:
    """Hold `run_dir` exclusively for one run: refuse one that holds another run unless resuming
    it or overwriting it, and lock out other processes until the block ends. `resumable`: whether
    the command has a `--resume` to suggest."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirError("--resume continues a run and --overwrite replaces it: choose one")
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory: give --out a directory path")
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    locked = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RunDirBusy(f"{run_dir} is in use by another taut process (PID {holder}); "
                             f"wait for it to finish, stop it, or use another --out") from None
        locked = True
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        report_stopped(run_dir)         # a previous process killed from outside (taut.heartbeat) says so
        existing = run_files(run_dir)
        if existing and not resume:
            if not overwrite:
                resume_hint = f"continue it with --resume {run_dir}, " if resumable else ""
                raise RunDirError(f"{run_dir} already holds a run ({', '.join(existing)}): {resume_hint}"
                                  f"replace it with --overwrite, or choose another --out")
            for name in existing:
                path = run_dir / name
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        try:
            yield run_dir
        except BaseException:
            if not resume:
                _forget_empty_run(run_dir)
            raise
    finally:
        try:
            if locked:
                os.ftruncate(fd, 0)      # still holding the lock: the next holder writes its own PID
        finally:
            os.close(fd)                 # closing releases the lock

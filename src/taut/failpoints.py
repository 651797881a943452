"""Failpoints: named places in a run where a test can kill the process, to prove exact resume.

`TAUT_FAILPOINT=name@step` kills the process with SIGKILL when the run reaches that place at
that step. Unset (always, outside tests), `reach` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "TAUT_FAILPOINT"


def reach(name: str, step: int) -> None:
    if os.environ.get(ENV) == f"{name}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)

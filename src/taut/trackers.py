"""Experiment trackers: every `metrics.jsonl` record, mirrored to W&B, TensorBoard or Trackio.

`open_trackers(config, run_dir, resume_step)` returns a `Trackers` whose `.log(record)` takes
the same dict the training loop writes to `metrics.jsonl` (its step from `record["step"]`) and
whose `.close()` ends the tracker runs. With `report_to: []` (the default) it is a no-op.

A record's numbers are logged as scalars under their `metrics.jsonl` names (booleans as 0/1);
text fields (`phase`, `strategy`, `event`, …) as text, only when they change, so a phase change
or an early stop shows up at its step; `None` (a non-finite value in the log) is skipped.
The resolved configuration is logged once per tracker run.

Resume continues the same tracker run: W&B's run id and Trackio's run name are kept in
`RUN/trackers.json`; TensorBoard writes into the same `RUN/tensorboard/` directory and drops
events logged after the checkpoint being resumed from (`purge_step`), as `metrics.jsonl` does.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Protocol

from taut.config import RunConfig, to_yaml

STATE = "trackers.json"


class TrackerMissing(RuntimeError):
    """A tracker named in `report_to` whose package is not installed."""


class Tracker(Protocol):
    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None: ...
    def close(self) -> None: ...


class Trackers:
    """The trackers of one run; `log` takes a `metrics.jsonl` record."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers
        self._last_text: dict[str, str] = {}

    def log(self, record: dict[str, Any]) -> None:
        if not self.trackers:
            return
        step = int(record["step"])
        scalars, texts = split_record(record)
        changed = {k: v for k, v in texts.items() if self._last_text.get(k) != v or k == "event"}
        self._last_text |= texts
        for tracker in self.trackers:
            tracker.log(step, scalars, changed)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def split_record(record: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """A record's numeric fields (booleans as 0/1, non-finite and None dropped) and its text fields;
    `step` itself is the x axis, not a metric. Nested dicts are flattened as `key/sub`."""
    scalars: dict[str, float] = {}
    texts: dict[str, str] = {}
    for key, value in record.items():
        if key == "step" or value is None:
            continue
        if isinstance(value, dict):
            inner_scalars, inner_texts = split_record({f"{key}/{k}": v for k, v in value.items()})
            scalars |= inner_scalars
            texts |= inner_texts
        elif isinstance(value, bool):
            scalars[key] = float(value)
        elif isinstance(value, (int, float)):
            if math.isfinite(value):
                scalars[key] = float(value)
        else:
            texts[key] = value if isinstance(value, str) else json.dumps(value)
    return scalars, texts


def open_trackers(config: RunConfig, run_dir: Path, resume_step: int | None = None) -> Trackers:
    """The trackers named in `config.report_to`, writing under `run_dir`. `resume_step`: the step of
    the checkpoint a resumed run continues from (None for a fresh run)."""
    run_dir = Path(run_dir)
    state_path = run_dir / STATE
    state = json.loads(state_path.read_text()) if resume_step is not None and state_path.exists() else {}
    openers = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "trackio": TrackioTracker}
    trackers = []
    try:
        for name in dict.fromkeys(config.report_to):
            trackers.append(openers[name](config, run_dir, resume_step, state))
    except BaseException:
        for tracker in trackers:
            tracker.close()
        raise
    if trackers:
        run_dir.mkdir(parents=True, exist_ok=True)
        state_path.write_text(json.dumps(state, indent=1))
    return Trackers(trackers)


def _require(module: str, tracker: str):
    """Import a tracker's package, or say which extra installs it (the extra is named after the tracker)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackerMissing(f"report_to lists {tracker!r} but the {module!r} package is not installed: "
                             f"pip install 'taut[{tracker}]'") from None


class TensorBoardTracker:
    """Event files in `RUN/tensorboard/`."""

    def __init__(self, config: RunConfig, run_dir: Path, resume_step: int | None, state: dict):
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"),
                                    purge_step=None if resume_step is None else resume_step + 1)
        if resume_step is None:
            self.writer.add_text("config", "```yaml\n" + to_yaml(config) + "```", 0)
        state["tensorboard"] = {"log_dir": "tensorboard"}

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        for key, value in texts.items():
            self.writer.add_text(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run in `RUN/wandb/` (offline with `WANDB_MODE=offline`); every metric is plotted
    against the trainer's `step`, so re-logged steps after a resume are not dropped."""

    def __init__(self, config: RunConfig, run_dir: Path, resume_step: int | None, state: dict):
        wandb = _require("wandb", "wandb")
        previous = state.get("wandb", {}).get("id")
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "taut"), name=run_dir.name, dir=str(run_dir),
            id=previous, resume="allow" if previous else None,
            config=config.model_dump(mode="json"),
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        state["wandb"] = {"id": self.run.id, "project": self.run.project}

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        self.run.log({"step": step, **scalars, **texts})

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    """A Trackio run (local-first: a SQLite database under Trackio's own directory)."""

    def __init__(self, config: RunConfig, run_dir: Path, resume_step: int | None, state: dict):
        self.trackio = _require("trackio", "trackio")
        name = state.get("trackio", {}).get("name") or f"{run_dir.name}-{os.urandom(3).hex()}"
        self.trackio.init(project=os.environ.get("TRACKIO_PROJECT", "taut"), name=name,
                          config=config.model_dump(mode="json"), resume="allow" if resume_step is not None else "never")
        state["trackio"] = {"name": name}

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        self.trackio.log({**scalars, **texts}, step=step)

    def close(self) -> None:
        self.trackio.finish()

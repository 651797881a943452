"""What a report knows about a run: its evaluated checkpoints and its training log.

A run directory holds `eval/<checkpoint>.json` files written by `taut eval` (one per evaluated
checkpoint), `metrics.jsonl` (one record per RL step, plus validation records on some steps)
and optionally `selection.json`, naming the checkpoint the run stands for. The report reads
every evaluation, orders them by training step, and compares the run's *first* evaluated
checkpoint (usually step 0, the starting model) with its *chosen* one: the selected
checkpoint when it was evaluated, else the latest evaluated.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taut.checkpoint import SELECTION, checkpoint_step
from taut.runlog import read_metrics

log = logging.getLogger(__name__)

EVAL_DIR = "eval"
CURRICULUM = "curriculum.json"


@dataclass
class Evaluation:
    """One evaluated checkpoint: its name, training step and the evaluation JSON."""

    checkpoint: str
    step: int
    result: dict[str, Any]


@dataclass
class RunResults:
    label: str
    run_dir: Path
    evaluations: list[Evaluation]          # in step order
    chosen: Evaluation                     # the selected checkpoint if evaluated, else the latest evaluated
    selected: str | None                   # the name in selection.json, if any
    metrics: list[dict[str, Any]]          # metrics.jsonl records, in file order
    phases: list[dict[str, Any]] = field(default_factory=list)   # curriculum.json phases: name, start/end step, strategy

    @property
    def first(self) -> Evaluation:
        return self.evaluations[0]

    def has_progress(self) -> bool:
        """Whether the chosen checkpoint differs from the first one (so changes can be reported)."""
        return self.chosen.step != self.first.step

    def at_step(self, step: int) -> Evaluation | None:
        return next((e for e in self.evaluations if e.step == step), None)


def load_run(run_dir: Path, label: str) -> RunResults:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    evaluations = read_evaluations(run_dir)
    if not evaluations:
        raise ValueError(f"run {run_dir} has no evaluations under {run_dir / EVAL_DIR}: run `taut eval {run_dir}` first")
    selected = None
    if (run_dir / SELECTION).exists():
        selected = json.loads((run_dir / SELECTION).read_text())["checkpoint"]
    by_name = {e.checkpoint: e for e in evaluations}
    if selected is not None and selected not in by_name:
        log.warning("run %s selected %s but it has no evaluation; reporting the latest evaluated checkpoint, %s",
                    run_dir, selected, evaluations[-1].checkpoint)
    chosen = by_name.get(selected, evaluations[-1])
    curriculum = run_dir / CURRICULUM
    phases = json.loads(curriculum.read_text())["phases"] if curriculum.exists() else []
    return RunResults(label, run_dir, evaluations, chosen, selected, read_metrics(run_dir), phases)


def read_evaluations(run_dir: Path) -> list[Evaluation]:
    """Every `RUN/eval/step-*.json`, in step order. A JSON named otherwise (an evaluation of
    something that is not one of the run's checkpoints) has no step and is skipped, with a warning."""
    found = []
    for path in sorted((Path(run_dir) / EVAL_DIR).glob("*.json")):
        if not path.stem.startswith("step-") or not path.stem.removeprefix("step-").isdigit():
            log.warning("skipping %s: not named after a checkpoint (step-NNNNNN.json)", path)
            continue
        found.append(Evaluation(path.stem, checkpoint_step(Path(path.stem)), json.loads(path.read_text())))
    return sorted(found, key=lambda e: e.step)


def unique_labels(run_dirs: list[Path], labels: list[str] | None) -> list[str]:
    """The given labels, or each run directory's name — with its parent's where names repeat."""
    if labels is not None:
        if len(labels) != len(run_dirs):
            raise ValueError(f"got {len(labels)} labels for {len(run_dirs)} runs: give one --label per run, in order")
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels must be distinct, got {labels}")
        return list(labels)
    names = [Path(d).resolve().name for d in run_dirs]
    if len(set(names)) == len(names):
        return names
    long = [f"{Path(d).resolve().parent.name}/{Path(d).resolve().name}" for d in run_dirs]
    if len(set(long)) == len(long):
        return long
    return [f"{name} ({i + 1})" for i, name in enumerate(names)]


def value(summary: dict[str, Any], key: str) -> float:
    """A number from an evaluation summary; nan where it is missing or was not finite (null)."""
    v = summary.get(key)
    return float("nan") if v is None else float(v)


def change_pct(before: float, after: float) -> float:
    """Relative change in percent; nan when undefined (a missing value or a zero baseline)."""
    if math.isnan(before) or math.isnan(after) or before == 0:
        return float("nan")
    return 100.0 * (after - before) / before

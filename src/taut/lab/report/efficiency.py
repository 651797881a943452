"""The field's efficiency measures for a comparison of runs, from the samples `taut eval` keeps
beside each evaluation (`RUN/eval/<checkpoint>.samples.jsonl`); no oracle is needed.

- overthinking: ThoughtTerminator's global measure (arXiv 2504.13367) — each run's mean spend on
  a problem over the shortest correct answer to it among every evaluation compared (the runs'
  first and chosen checkpoints), averaged over problems (`taut.metrics.overthinking`);
- underthinking: accuracy the chosen checkpoint lost on the problems its run's first evaluated
  checkpoint solved (`taut.metrics.underthinking`).

A run whose samples files are missing (an evaluation written elsewhere with `--out`, or an
older one) gets nan, shown as "–".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from taut.evaluate import read_outcomes
from taut.lab.report.runs import EVAL_DIR, Evaluation, RunResults
from taut.metrics import Outcomes, overthinking, shortest_correct, underthinking


def sample_outcomes(run_dir: Path, evaluation: Evaluation) -> Outcomes | None:
    """Problem id → (length, correct) of an evaluation's samples, if its samples file exists."""
    return read_outcomes(Path(run_dir) / EVAL_DIR / f"{evaluation.checkpoint}.samples.jsonl")


def efficiency(runs: list[RunResults]) -> list[dict[str, Any]]:
    """Per run, in order: overthinking (tokens, global over the comparison) and underthinking
    (points of accuracy lost on the problems its start solved; nan when first = chosen)."""
    first = [sample_outcomes(r.run_dir, r.first) for r in runs]
    chosen = [sample_outcomes(r.run_dir, r.chosen) for r in runs]
    shortest = shortest_correct(*(o for o in first + chosen if o is not None))
    rows = []
    for run, start, now in zip(runs, first, chosen):
        lost, counted = (math.nan, 0)
        if start is not None and now is not None and run.chosen is not run.first:
            lost, counted = underthinking(start, now)
        rows.append({"overthinking_tokens": overthinking(now, shortest) if now is not None else math.nan,
                     "underthinking_pp": 100 * lost, "underthinking_problems": counted})
    return rows

"""The side-by-side table: one row per run at its chosen checkpoint, with the change a run's
headline phase made; and per curriculum phase, its change against the phase before it.

A run trained in phases (curriculum.json) is judged by what each phase did: the accuracy phase
against the start, the compression phase against the accuracy phase. Its headline is the last
phase with a length strategy (not `none`) whose two ends were evaluated; a run without phases,
or without those evaluations, is judged from its first evaluated checkpoint to its chosen one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from rich import box
from rich.table import Table

from taut.lab.report.runs import Evaluation, RunResults, change_pct, value


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    fmt: Callable[[float], str]
    best: str | None = None          # "max" or "min": the best value is highlighted when runs are compared
    help: str = ""
    short: str | None = None         # header in the terminal table; None leaves the column out there


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _tokens(v: float) -> str:
    return f"{v:.1f}"


def _change(v: float) -> str:
    return f"{v:+.1f}%"


def _points(v: float) -> str:
    return f"{v:+.1f}pp"


COLUMNS = [
    Column("accuracy", "accuracy", _pct, "max", "mean over all samples, all evaluated tasks", "acc"),
    Column("tokens_mean", "mean tokens", _tokens, "min", "mean response length in tokens", "tokens"),
    Column("tokens_p90", "p90 tokens", _tokens, "min", "90th percentile of response length", "p90"),
    Column("tokens_change_pct", "Δ tokens", _change, "min",
           "change of mean tokens over the headline phase (else vs. the first evaluated checkpoint)", "Δtok"),
    Column("accuracy_change_pp", "Δ accuracy", _points, "max",
           "change of accuracy over the headline phase (else vs. the first evaluated checkpoint)", "Δacc"),
    Column("redundancy", "redundancy", _pct, "min", "share of tokens the task's oracle marks redundant", "redund"),
    Column("in_domain_accuracy", "in-domain acc.", _pct, "max", "accuracy on the domains RL trained on"),
    Column("in_domain_tokens", "in-domain tokens", _tokens, "min", "mean tokens on the domains RL trained on"),
    Column("held_out_accuracy", "held-out acc.", _pct, "max", "accuracy on domains RL never saw", "held\nacc"),
    Column("held_out_tokens", "held-out tokens", _tokens, "min", "mean tokens on domains RL never saw", "held\ntok"),
]


# the field's efficiency measures (taut.metrics, taut.lab.report.efficiency): a table of their own in the terminal
EFFICIENCY = [
    Column("tokens_per_correct", "tokens per correct", _tokens, "min",
           "every token spent, right or wrong, per correct answer", "tokens per correct"),
    Column("overthinking_tokens", "overthinking", _tokens, "min",
           "mean tokens over the shortest correct answer to the same problem among the runs compared "
           "(ThoughtTerminator's global measure, arXiv 2504.13367)", "overthinking"),
    Column("underthinking_pp", "accuracy lost where the start was right", _points, "min",
           "on the problems the run's first evaluated checkpoint solved (at least half its samples right): "
           "that accuracy minus the chosen checkpoint's", "lost where start right"),
]


def summary_row(run: RunResults) -> dict[str, Any]:
    """The table's numbers for one run (nan where undefined)."""
    overall = run.chosen.result["overall"]
    in_domain, held_out = run.chosen.result["in_domain"], run.chosen.result["held_out"]
    phases = phase_changes(run)
    headline = headline_change(run, phases)
    return {
        "label": run.label,
        "run_dir": str(run.run_dir),
        "strategy": strategy_plan(run.metrics),
        "first": run.first.checkpoint,
        "chosen": run.chosen.checkpoint,
        "selected": run.selected,
        "evaluations": len(run.evaluations),
        "accuracy": value(overall, "accuracy"),
        "tokens_mean": value(overall, "tokens_mean"),
        "tokens_p90": value(overall, "tokens_p90"),
        "tokens_per_correct": value(overall, "tokens_per_correct"),
        "tokens_change_pct": headline["tokens_change_pct"] if headline else math.nan,
        "accuracy_change_pp": headline["accuracy_change_pp"] if headline else math.nan,
        "change_over": headline["over"] if headline else None,
        "headline": headline,
        "phases": phases,
        "redundancy": value(overall, "redundancy"),
        "in_domain_accuracy": value(in_domain, "accuracy"),
        "in_domain_tokens": value(in_domain, "tokens_mean"),
        "held_out_accuracy": value(held_out, "accuracy"),
        "held_out_tokens": value(held_out, "tokens_mean"),
    }


def _between(before: Evaluation, after: Evaluation) -> dict[str, Any]:
    b, a = before.result["overall"], after.result["overall"]
    return {"from": before.checkpoint, "to": after.checkpoint,
            "accuracy_before": value(b, "accuracy"), "accuracy": value(a, "accuracy"),
            "tokens_before": value(b, "tokens_mean"), "tokens_mean": value(a, "tokens_mean"),
            "tokens_change_pct": change_pct(value(b, "tokens_mean"), value(a, "tokens_mean")),
            "accuracy_change_pp": 100 * (value(a, "accuracy") - value(b, "accuracy"))}


def phase_changes(run: RunResults) -> list[dict[str, Any]]:
    """Per curriculum phase whose start and end checkpoints were evaluated: its change against the
    phase before it (the first phase: against the start)."""
    out = []
    for phase in run.phases:
        before, after = run.at_step(phase["start_step"]), run.at_step(phase["end_step"])
        if before is None or after is None or before is after:
            continue
        out.append({"phase": phase["name"], "strategy": phase["strategy"], "start_step": phase["start_step"],
                    "end_step": phase["end_step"], "ended_by": phase.get("ended_by", "steps"), **_between(before, after)})
    return out


def headline_change(run: RunResults, phases: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The change a run is summed up by: its last evaluated phase with a length strategy, else
    first → chosen checkpoint (None when they are the same checkpoint)."""
    shaping = [p for p in phases if p["strategy"] != "none"]
    if shaping:
        p = shaping[-1]
        before = phases[phases.index(p) - 1]["phase"] if phases.index(p) > 0 else "the start"
        return {**p, "over": f"{p['phase']} phase ({p['strategy']}) vs. {before}"}
    if not run.has_progress():
        return None
    return {**_between(run.first, run.chosen), "over": f"{run.first.checkpoint} → {run.chosen.checkpoint}"}


def rich_table(rows: list[dict[str, Any]]) -> Table:
    """The side-by-side table for the terminal (rows as in `report.json`: missing values are None)."""
    columns = [c for c in COLUMNS if c.short]
    t = Table(title="runs at their chosen checkpoint", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False,
              caption="Δ: what the run's last length-control phase did against the phase before it (runs without "
                      "phases: first evaluated → chosen checkpoint); per phase: report.html", caption_justify="left")
    t.add_column("run", no_wrap=True)
    for column in columns:
        t.add_column(column.short, justify="right", no_wrap=True)
    for row in rows:
        t.add_row(f"{row['label']}\n[dim]{row['chosen']}[/dim]", *(formatted(row, c) for c in columns))
    return t


def strategy_plan(records: list[dict[str, Any]]) -> str | None:
    """The length strategies a run trained with, in order: `siri`, or per curriculum phase
    `accuracy: none → compression: mastery-gated`."""
    plan: list[tuple[str | None, str]] = []
    for r in records:
        if r.get("strategy") is not None and (not plan or plan[-1] != (r.get("phase"), r["strategy"])):
            plan.append((r.get("phase"), r["strategy"]))
    if len({phase for phase, _ in plan if phase is not None}) > 1:
        return " → ".join(f"{phase}: {strategy}" for phase, strategy in plan if phase is not None)
    return " → ".join(dict.fromkeys(strategy for _, strategy in plan)) or None


def formatted(row: dict[str, Any], column: Column) -> str:
    v = row.get(column.key)                         # absent: a report.json written before the column
    return "–" if v is None or math.isnan(v) else column.fmt(v)


def best_rows(rows: list[dict[str, Any]], column: Column) -> set[int]:
    """Indices of the rows holding the column's best value (none for a single run or no values)."""
    values = [(i, r[column.key]) for i, r in enumerate(rows) if not math.isnan(r[column.key])]
    if len(rows) < 2 or not values or column.best is None:
        return set()
    target = (max if column.best == "max" else min)(v for _, v in values)
    best = {i for i, v in values if v == target}
    return set() if len(best) == len(rows) else best        # a tie across every run singles nothing out


def efficiency_table(rows: list[dict[str, Any]]) -> Table:
    """The efficiency measures per run, for the terminal (`EFFICIENCY`)."""
    t = Table(title="efficiency", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False, caption_justify="left",
              caption="overthinking: mean tokens over the shortest correct answer to the same problem in any run "
                      "compared; lost: accuracy lost on the problems the run's start solved")
    t.add_column("run", no_wrap=True)
    for column in EFFICIENCY:
        t.add_column(column.short, justify="right")
    for row in rows:
        t.add_row(row["label"], *(formatted(row, c) for c in EFFICIENCY))
    return t

"""`taut demo`: the whole pipeline on the built-in testbed — RL from the shipped SFT checkpoint,
evaluated at the start and at the end of every phase, a stage table and the run's report."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich import box
from rich.table import Table

from taut.checkpoint import step_name
from taut.config import RunConfig
from taut.lab.report import write_run_report
from taut.rl.trainer import train_rl
from taut.runlog import console
from taut.workflows import evaluate_target


def run_demo(config: RunConfig, run_dir: Path, quiet: bool = False) -> Path:
    """RL from the shipped SFT checkpoint on the testbed into `run_dir`, evaluated at the start and
    at the end of every phase, then the report. Returns the report's path."""
    run_dir = Path(run_dir)
    t0 = time.perf_counter()
    plan = " → ".join(f"{p.name} ({p.strategy.name}, {p.steps} steps)" for p in config.plan())
    console.print(f"[bold]taut demo[/bold]: from {config.model.path}: {plan} → {run_dir}")
    train_rl(config, run_dir, quiet=quiet)
    phases = json.loads((run_dir / "curriculum.json").read_text())["phases"]
    stages = [("SFT", 0)] + [(f"+ {p['name']}", p["end_step"]) for p in phases]
    results = []
    for label, step in stages:
        checkpoint = run_dir / "checkpoints" / step_name(step)
        result, _ = evaluate_target(config, checkpoint, run_dir / "eval" / f"{checkpoint.name}.json", quiet=quiet)
        results.append((label, result))
    console.print(stages_table(results))
    report = write_run_report(run_dir)
    console.print(f"demo finished in {time.perf_counter() - t0:.0f} s")
    return report


def stages_table(results: list[tuple[str, dict]]) -> Table:
    """Accuracy and tokens at each stage, overall and on the easiest and hardest levels; each
    stage's change against the one before it. Fits 80 columns."""
    t = Table(title="the testbed, sampled at temperature 1 (test split)", box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1),
              pad_edge=False, caption="Δ: vs. the stage before; tok: mean tokens; held: held-out domains; L1/L4: easiest/hardest level",
              caption_justify="left")
    for col in ("stage", "acc", "Δacc", "tok", "Δtok", "redund", "held\nacc", "held\ntok", "L1\ntok", "L4\nacc"):
        t.add_column(col, justify="left" if col == "stage" else "right", no_wrap=True)
    previous = None
    for label, r in results:
        levels, overall = r["by_level"], r["overall"]
        delta_acc = delta_tok = ""
        if previous is not None:
            delta_acc = f"{100 * (overall['accuracy'] - previous['accuracy']):+.1f}pp"
            delta_tok = f"{100 * (overall['tokens_mean'] / previous['tokens_mean'] - 1):+.1f}%"
        t.add_row(label, f"{overall['accuracy']:.3f}", delta_acc, f"{overall['tokens_mean']:.1f}", delta_tok,
                  f"{overall.get('redundancy', 0):.2f}", f"{r['held_out']['accuracy']:.3f}",
                  f"{r['held_out']['tokens_mean']:.1f}", f"{levels['1']['tokens_mean']:.1f}", f"{levels['4']['accuracy']:.3f}")
        previous = overall
    return t

"""The overthinking study on SmolLM2-135M-Instruct, in one command (`make study-arith`).

For each method (recipes/real/smollm2-arith-{control,siri,mastery,dapo}.yaml): train it (or
resume it, or skip it when it is done), evaluate the checkpoint the run stands for on the test
split, sampled (the recipe's eval: T 0.7, 4 samples) and greedy; evaluate the start once the same
two ways (its files copied into every run); draw every run with `taut compare`; write the table
(OUT/study.md, OUT/study.json): accuracy, mean tokens and the share cut at the cap per task and
level, and each method's training time (wall and CPU).

Every step is a `taut` command, printed before it runs, so that any of them can be rerun by
hand. `--smoke` shrinks everything (2 steps of 2 × 2 rollouts of 16 tokens, 2 problems per level)
to check the pipeline in a few minutes (`make test-slow` runs it).

    python scripts/arith_study.py --out runs/arith [--methods control,mastery] [--threads 1] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from taut.checkpoint import chosen_checkpoint

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("control", "siri", "mastery", "dapo")
TASKS = (("basic_arithmetic/1", "additions (L1)"), ("basic_arithmetic/2", "additions and subtractions (L2)"),
         ("products/1", "products (unseen)"))
GREEDY = ["eval.temperature=0", "eval.samples=1"]
SMOKE = ["rl.steps=2", "rl.prompts_per_step=2", "rl.group_size=2", "rl.max_new_tokens=16", "rl.checkpoint_every=1",
         "data.pool_per_level=8", "validation.every=1", "validation.n_per_level=2",
         "eval.n_per_level=2", "eval.samples=1", "eval.max_new_tokens=16", "eval.budgets=[8,16]"]
SMOKE_BY_METHOD = {
    "siri": ["strategy.l_max=16", "strategy.l_min=8", "strategy.period=2"],
    "mastery": ["rl.steps=3", "phases.0.steps=1", "phases.1.steps=1", "phases.2.steps=1"],
    "dapo": [],
    "control": [],
}


def recipe(method: str) -> Path:
    return ROOT / "recipes" / "real" / f"smollm2-arith-{method}.yaml"


class StepFailed(Exception):
    """A taut command of the study exited with an error (its own message is above it)."""


def taut(*args: str) -> float:
    """Run one taut command (printed first); its wall seconds. A failure stops the study."""
    command = [str(Path(sys.executable).parent / "taut"), *args]
    shown = " ".join(shlex.quote(a) for a in command)
    print("$", shown, flush=True)
    tick = time.perf_counter()
    if (code := subprocess.run(command).returncode) != 0:
        raise StepFailed(f"the study stopped: exit status {code} from\n  {shown}\n"
                         f"fix the cause and run the study again: done steps are skipped, a cut run resumes")
    return time.perf_counter() - tick


def sets(overrides: list[str]) -> list[str]:
    return [a for item in overrides for a in ("--set", item)]


def train(method: str, run: Path, overrides: list[str]) -> dict:
    """Train (or resume) one method; its recorded times, kept in RUN/study-seconds.json."""
    record = run / "study-seconds.json"
    if (run / "selection.json").exists() or (run / "curriculum.json").exists():
        if record.exists():
            return json.loads(record.read_text())
        return {"wall": None, "cpu": None, "note": "trained before this study's timing was kept"}
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    if (run / "checkpoints").is_dir():
        wall = taut("train", "--resume", str(run), *sets(overrides))
        note = "resumed: the time of the last part only"
    else:
        wall = taut("train", "--config", str(recipe(method)), "--out", str(run), *sets(overrides))
        note = ""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    times = {"wall": wall, "cpu": (after.ru_utime + after.ru_stime) - (cpu.ru_utime + cpu.ru_stime), "note": note}
    record.write_text(json.dumps(times, indent=1))
    return times


def evaluate(run: Path, decoding: str, overrides: list[str], start: bool = False) -> dict:
    """Evaluate the checkpoint a run stands for (or, with `start`, its step 0) one way, unless done:
    sampled evaluations go to RUN/eval/ (what `taut compare` reads), greedy ones to RUN/eval-greedy/."""
    folder = run / ("eval-greedy" if decoding == "greedy" else "eval")
    checkpoint = run / "checkpoints" / "step-000000" if start else chosen_checkpoint(run)
    out = folder / f"{checkpoint.name}.json"          # a run that chose its start shares the start's file
    if not out.exists():
        taut("eval", str(checkpoint), "--config", str(run / "config.yaml"),
             *sets(overrides + (GREEDY if decoding == "greedy" else [])), "--out", str(out))
    return json.loads(out.read_text())


def share_start(source: Path, run: Path) -> None:
    """Every recipe starts from the same model with the same seed and eval settings: the start is
    evaluated once and its files copied into the other runs, for the report."""
    for folder in ("eval", "eval-greedy"):
        for file in (source / folder).glob("step-000000.*"):
            target = run / folder / file.name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(file, target)


def start_source(out: Path, runs: dict[str, Path]) -> Path:
    """Where the start is evaluated: once, in a run of the study directory that has both of its
    evaluations already (the runs of this call first, then the other methods' runs), else in the
    first run of this call; the files are then shared with every run."""
    candidates = [*runs.values(), *(out / m for m in METHODS if m not in runs)]
    done = (run for run in candidates if all((run / f / "step-000000.json").exists() for f in ("eval", "eval-greedy")))
    return next(done, next(iter(runs.values())))


def cells(report: dict) -> dict:
    """Accuracy, mean tokens and share cut at the cap for each task and level of one evaluation,
    and for the training task as a whole (the evaluation's in-domain summary)."""
    out = {key: {"accuracy": c["accuracy"], "tokens": c["tokens_mean"], "cut": c["truncation_rate"], "n": c["n_problems"]}
           for key, _ in TASKS if (c := report["by_cell"].get(key))}
    if report.get("in_domain"):
        out["trained"] = {"accuracy": report["in_domain"]["accuracy"], "tokens": report["in_domain"]["tokens_mean"]}
    return out


def table(rows: list[dict]) -> str:
    """The results table (accuracy / mean tokens per task and level), then each run's training time."""
    head = ("| checkpoint | decoding | training task (L1 + L2) | " + " | ".join(name for _, name in TASKS)
            + " | cut at the cap |")
    lines = [head, "|" + "---|" * (len(TASKS) + 4)]
    times = {}
    for row in rows:
        c = row["cells"]
        values = [f"{c[k]['accuracy']:.3f} / {c[k]['tokens']:.1f}" if k in c else "–" for k in ("trained", *dict(TASKS))]
        cut = ", ".join(f"{c[k]['cut']:.0%}" for k, _ in TASKS if k in c)
        lines.append(f"| {row['name']} ({row['checkpoint']}) | {row['decoding']} | " + " | ".join(values) + f" | {cut} |")
        if row.get("train"):
            times[row["name"]] = row["train"]
    lines += ["", "Cells: accuracy / mean response tokens on the test split.", "", "Training time:"]
    for name, t in times.items():
        measured = f"{t['wall'] / 60:.0f} min wall, {t['cpu'] / 60:.0f} min CPU" if t.get("wall") else "not recorded"
        lines.append(f"- {name}: {measured}" + (f" ({t['note']})" if t.get("note") else ""))
    return "\n".join(lines) + "\n"


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of threads ≥ 1, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/arith"))
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, of " + ", ".join(METHODS))
    parser.add_argument("--threads", type=positive, default=None, help="torch threads per command (default: all cores)")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a tiny sample: checks the pipeline")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods:
        parser.error(f"--methods: unknown {', '.join(unknown) or '(none given)'}; expected some of {', '.join(METHODS)}")
    common = (SMOKE if args.smoke else []) + ([f"model.threads={args.threads}"] if args.threads else [])
    args.out.mkdir(parents=True, exist_ok=True)

    runs = {method: args.out / method for method in methods}
    times = {method: train(method, run, common + (SMOKE_BY_METHOD[method] if args.smoke else []))
             for method, run in runs.items()}
    source = start_source(args.out, runs)
    rows = []
    for decoding in ("sampled", "greedy"):
        report = evaluate(source, decoding, common, start=True)
        rows.append({"name": "start", "checkpoint": "step 0", "decoding": decoding, "cells": cells(report)})
    for method, run in runs.items():
        share_start(source, run)
        for decoding in ("sampled", "greedy"):
            report = evaluate(run, decoding, common)
            rows.append({"name": method, "checkpoint": f"step {report['step']}", "decoding": decoding,
                         "cells": cells(report), "train": times[method]})
    taut("compare", *map(str, runs.values()), "--out", str(args.out / "report"), *[a for m in methods for a in ("--label", m)])
    rows.sort(key=lambda r: (r["decoding"] != "greedy", r["name"] != "start"))
    (args.out / "study.json").write_text(json.dumps({"smoke": args.smoke, "rows": rows}, indent=1))
    text = table(rows)
    (args.out / "study.md").write_text(text)
    print(text)
    print(f"table: {args.out / 'study.md'}; report: {args.out / 'report'}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except StepFailed as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)

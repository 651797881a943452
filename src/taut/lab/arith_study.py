"""The overthinking study on SmolLM2-135M-Instruct, in one command (`make study-arith`).

For each method (builtin:real/smollm2-arith-{control,siri,mastery,dapo}, recipes/real/): train it (or
resume it, or skip it when it is done), evaluate the checkpoint the run stands for on the test
split, sampled (the recipe's eval: T 0.7, 4 samples) and greedy; evaluate the start once the same
two ways (its files copied into every run); draw every run with `taut compare`; write the table
(OUT/study.md, OUT/study.json): accuracy, mean tokens and the share cut at the cap per task and
level, and each method's training time (wall, and the CPU of its own process). `--workers 2` trains
two methods side by side on one thread each, which uses two cores better than one run on two; side
by side, each gives the memory torch frees back to the kernel (`model.keep_freed_memory=false`):
keeping it, two processes grew to 14.5 and 13.0 GB on 2026-12-06 and the kernel killed them.

Every step is a `taut` command, printed before it runs, so that any of them can be rerun by
hand. `--smoke` shrinks everything (2 steps of 2 × 2 rollouts of 16 tokens, 2 problems per level)
to check the pipeline in a few minutes (`make test-slow` runs it).

    python -m taut.lab.arith_study --out runs/arith [--methods control,mastery] [--threads 1] [--workers 2] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from taut.checkpoint import chosen_checkpoint, run_finished
from taut.lab.commands import CommandFailed, run_taut

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


def recipe(method: str) -> str:
    return f"builtin:real/smollm2-arith-{method}"


StepFailed = CommandFailed          # a taut command of the study exited with an error


def taut(*args: str, log: Path | None = None) -> tuple[float, float]:
    """Run one taut command (taut.lab.commands.run_taut): its wall and CPU seconds. A failure stops the study."""
    return run_taut(*args, log=log)


def sets(overrides: list[str]) -> list[str]:
    return [a for item in overrides for a in ("--set", item)]


def train(method: str, run: Path, overrides: list[str], log: bool = False) -> dict:
    """Train (or resume) one method; its recorded times, kept in RUN/study-seconds.json. With `log`,
    the command's output goes to OUT/METHOD.train.log, beside the run (for runs trained side by side)."""
    record = run / "study-seconds.json"
    if run_finished(run):
        if record.exists():
            return json.loads(record.read_text())
        return {"wall": None, "cpu": None, "note": "trained before this study's timing was kept"}
    sink = run.parent / f"{run.name}.train.log" if log else None
    if (run / "checkpoints").is_dir():
        wall, cpu = taut("train", "--resume", str(run), *sets(overrides), log=sink)
        note = "resumed: the time of the last part only"
    else:
        wall, cpu = taut("train", "--config", str(recipe(method)), "--out", str(run), *sets(overrides), log=sink)
        note = ""
    times = {"wall": wall, "cpu": cpu, "note": note}
    record.write_text(json.dumps(times, indent=1))
    return times


def train_all(runs: dict[str, Path], overrides: dict[str, list[str]], workers: int) -> dict[str, dict]:
    """Train every method, `workers` at a time (output to logs when more than one); their times."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        started = {method: pool.submit(train, method, run, overrides[method], workers > 1) for method, run in runs.items()}
        return {method: future.result() for method, future in started.items()}


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
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 1, got {text!r}")
    return int(text)


PEAK_GB = 11.4            # the most a training process of the study held resident here (docs/real-models.md)


def memory_gb() -> float | None:
    """The machine's memory (MemTotal in /proc/meminfo, Linux), in GiB; None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_warning(workers: int, memory: float | None) -> str | None:
    """A warning when `workers` training processes side by side may not fit in the machine's memory
    (two fit in 23.5 GiB here, each peaking at 11.4)."""
    need = workers * PEAK_GB
    if workers < 2 or memory is None or memory >= need:
        return None
    return (f"warning: {workers} methods side by side may need up to {need:.0f} GB (one training process peaked at "
            f"{PEAK_GB} GB here, docs/real-models.md) and this machine has {memory:.1f} GB; if a run is killed for "
            f"memory, rerun with --workers 1 (finished steps are kept)")


def training_overrides(workers: int, threads: int, threads_given: bool, smoke: bool) -> list[str]:
    """The settings every training command of the study gets: one thread each side by side, and,
    side by side, freed memory given back to the kernel (kept, the default, two processes grew to
    14.5 and 13.0 GB here and the kernel killed them)."""
    out = (SMOKE if smoke else []) + ([f"model.threads={threads}"] if workers > 1 or threads_given else [])
    if workers > 1:
        out.append("model.keep_freed_memory=false")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/arith"))
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, of " + ", ".join(METHODS))
    parser.add_argument("--threads", type=positive, default=None, help="torch threads per command (default: all cores)")
    parser.add_argument("--workers", type=positive, default=1,
                        help="methods trained side by side, each on cores / workers threads unless --threads "
                             "(their output in OUT/METHOD.train.log); evaluations run one at a time")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a tiny sample: checks the pipeline")
    args = parser.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods:
        parser.error(f"--methods: unknown {', '.join(unknown) or '(none given)'}; expected some of {', '.join(METHODS)}")
    common = (SMOKE if args.smoke else []) + ([f"model.threads={args.threads}"] if args.threads else [])
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    training = training_overrides(args.workers, threads, bool(args.threads), args.smoke)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.smoke and (warning := memory_warning(min(args.workers, len(methods)), memory_gb())):
        print(warning, file=sys.stderr, flush=True)

    runs = {method: args.out / method for method in methods}
    times = train_all(runs, {m: training + (SMOKE_BY_METHOD[m] if args.smoke else []) for m in runs}, args.workers)
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
        print(f"error: the study stopped: {err}\nfix the cause and run the study again: done steps are skipped, "
              f"a cut run resumes", file=sys.stderr)
        sys.exit(1)

"""The experiment matrix: every method from one shared start, side by side on the testbed.

1. One accuracy-RL run (plain GRPO) from the shipped SFT checkpoint gives the shared start.
2. Every method continues from that start with fixed seeds and the same rollout budget:
   `steps` RL steps of `prompts_per_step × group_size` rollouts each (dynamic sampling is off,
   so no method draws extra rollouts; a curriculum phase stopped early uses fewer).
3. Each method's checkpoint(s) are evaluated on the test split, in-domain and held-out, and the
   start is evaluated once with the same settings.
4. The results are written as JSON, a comparison report (figures), and `BENCHMARKS.md`, whose
   hand-written discussion (between the discussion markers) is kept across regenerations.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import shutil
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from taut.checkpoint import chosen_checkpoint, run_finished
from taut.config import (
    ConfigError,
    EvalConfig,
    PhaseConfig,
    RLConfig,
    RunConfig,
    SelectionConfig,
    ValidationConfig,
    read_yaml,
)
from taut.evaluate import finite, read_outcomes
from taut.lab.report import compare
from taut.length import StrategyConfig
from taut.metrics import overthinking, shortest_correct, underthinking
from taut.rl.trainer import train_rl
from taut.runlog import console
from taut.schema import Strict
from taut.workflows import evaluate_target

DISCUSSION_START, DISCUSSION_END = "<!-- discussion -->", "<!-- /discussion -->"


class Method(Strict):
    name: str
    seeds: list[int] = Field(default_factory=lambda: [0])
    strategy: StrategyConfig | None = None
    phases: list[PhaseConfig] | None = None
    validation: ValidationConfig | None = None
    selection: SelectionConfig | None = None
    evaluate: dict[str, int] | None = Field(None, description="label → step to evaluate (default: the run's chosen checkpoint)")


class BenchConfig(Strict):
    seed: int = 0
    model: str = "builtin:testbed-sft"
    threads: int | None = None
    workers: int = Field(1, ge=1, description="method runs trained at the same time, each in its own process "
                                              "(with threads: 1, one per core)")
    start_steps: int = Field(100, ge=1, description="accuracy-RL steps that make the shared start")
    steps: int = Field(120, ge=1, description="RL steps per method from the start")
    train: list[str] = Field(default_factory=lambda: ["gym:train"], description="task specs the start and every method train on")
    rl: RLConfig = Field(default_factory=lambda: RLConfig(dynamic_sampling=False))
    eval: EvalConfig = Field(default_factory=lambda: EvalConfig(n_per_level=50, samples=2))
    methods: list[Method]


def load_bench(path: Path, quick: bool = False) -> BenchConfig:
    """A plain bench recipe (a suite recipe, which expands sweeps, loads with taut.lab.bench.suite.load_any_bench)."""
    raw = read_yaml(path)
    quick_overrides = raw.pop("quick", {})
    if quick:
        raw = {**raw, **quick_overrides}
    try:
        return BenchConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{path}{' (quick)' if quick else ''}: {err}") from None


def _run_config(bench: BenchConfig, model: str, steps: int, seed: int, method: Method | None) -> RunConfig:
    data: dict[str, Any] = {
        "seed": seed,
        "model": {"path": model, **({"threads": bench.threads} if bench.threads else {})},
        "data": {"train": list(bench.train), "eval": ["gym:all"]},
        "rl": {**bench.rl.model_dump(), "steps": steps},
        "eval": bench.eval.model_dump(),
    }
    if method is not None:
        if method.strategy is not None:
            data["strategy"] = method.strategy.model_dump()
        if method.phases is not None:
            data["phases"] = [p.model_dump() for p in method.phases]
            data["rl"]["steps"] = None if steps >= sum(p.steps for p in method.phases) else steps
        if method.validation is not None:
            data["validation"] = method.validation.model_dump()
        if method.selection is not None:
            data["selection"] = method.selection.model_dump()
        if method.evaluate:                    # every step to evaluate must get a checkpoint
            data["rl"]["checkpoint_every"] = math.gcd(data["rl"]["checkpoint_every"], *[s for s in method.evaluate.values() if s > 0])
    return RunConfig.model_validate(data)


def run_bench(bench: BenchConfig, out: Path, benchmarks_md: Path | None, command: str) -> dict[str, Any]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}

    # ---- the shared start ------------------------------------------------------------------
    start_dir = out / "start"
    start_cfg = _run_config(bench, bench.model, bench.start_steps, bench.seed, None)
    tick = time.perf_counter()
    resumed: list[str] = []
    fresh = not run_finished(start_dir)
    if fresh:
        shutil.rmtree(start_dir, ignore_errors=True)
        train_rl(start_cfg, start_dir, quiet=True)
    start_ckpt = chosen_checkpoint(start_dir)
    start_eval_path = out / "start-eval.json"
    if not start_eval_path.exists():
        evaluate_target(start_cfg, start_ckpt, start_eval_path)
    start_eval = json.loads(start_eval_path.read_text())
    timings["start"], found_done = _recorded_seconds(start_dir, time.perf_counter() - tick, fresh)
    if found_done:
        resumed.append(str(start_dir))
    console.print(f"bench: start {start_ckpt} — accuracy {start_eval['overall']['accuracy']:.3f}, "
                  f"{start_eval['overall']['tokens_mean']:.1f} tokens ({timings['start']:.0f} s)")

    # ---- the methods -------------------------------------------------------------------------
    jobs = [(method, seed) for method in bench.methods for seed in method.seeds]
    if bench.workers > 1:          # independent runs from the same start, `workers` at a time
        context = multiprocessing.get_context("spawn")      # fresh interpreters: no forked OpenMP state
        with ProcessPoolExecutor(max_workers=bench.workers, mp_context=context) as pool:
            done = list(pool.map(_run_method, *zip(*[(bench, method, seed, start_ckpt, start_eval_path, out)
                                                      for method, seed in jobs])))
    else:
        done = [_run_method(bench, method, seed, start_ckpt, start_eval_path, out) for method, seed in jobs]
    results: dict[str, Any] = {}
    for key, result, was_resumed in done:
        results[key] = result
        timings[key] = result["seconds"]
        if was_resumed:
            resumed.append(result["run_dir"])
    add_efficiency(start_eval, start_eval_path, results)

    # the matrix's wall clock, recorded when every run trained in this invocation; a matrix found
    # complete reports that record, a partly resumed one the sum of its runs' recorded times
    # (longer than the wall clock was when workers > 1)
    if not resumed:
        seconds, timed = _recorded_seconds(out, time.perf_counter() - t0, True)[0], "wall"
    elif len(resumed) == 1 + len(jobs) and (out / "bench-seconds.json").exists():
        seconds, timed = _recorded_seconds(out, 0.0, False)[0], "record"
    else:
        seconds, timed = sum(timings.values()), "sum"
    summary = {"start": start_eval, "results": results, "rows": summarise(start_eval, results),
               "seconds": seconds, "timed": timed, "resumed": resumed, "timings": timings, "command": command,
               "config": bench.model_dump(mode="json")}
    (out / "bench.json").write_text(json.dumps(finite(summary), indent=1))
    figures = _figures(out, results)
    if benchmarks_md is not None:
        write_benchmarks_md(benchmarks_md, summary, figures)
    return summary


def _run_method(bench: BenchConfig, method: Method, seed: int, start_ckpt: Path, start_eval_path: Path,
                out: Path) -> tuple[str, dict[str, Any], bool]:
    """Train one method with one seed from the start (unless its run is done) and evaluate it:
    (key, result, whether the run was found done)."""
    key = f"{method.name}/seed{seed}"
    run_dir = out / method.name / f"seed{seed}"
    tick = time.perf_counter()
    config = _run_config(bench, str(start_ckpt), bench.steps, seed, method)
    fresh = not run_finished(run_dir)
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
        train_rl(config, run_dir, quiet=True)
    (run_dir / "eval").mkdir(exist_ok=True)
    shutil.copy(start_eval_path, run_dir / "eval" / "step-000000.json")   # step 0 is the start's weights
    targets = ({label: run_dir / "checkpoints" / f"step-{step:06d}" for label, step in method.evaluate.items()}
               if method.evaluate else {"final": chosen_checkpoint(run_dir)})
    evals = {}
    for label, ckpt in targets.items():
        path = run_dir / "eval" / f"{ckpt.name}.json"
        if not path.exists():
            evaluate_target(config, ckpt, path)
        evals[label] = json.loads(path.read_text())
    curriculum = json.loads((run_dir / "curriculum.json").read_text())
    seconds, found_done = _recorded_seconds(run_dir, time.perf_counter() - tick, fresh)
    result = {"method": method.name, "seed": seed, "run_dir": str(run_dir), "evals": evals,
              "phases": curriculum["phases"], "seconds": seconds}
    for label, e in evals.items():
        console.print(f"bench: {key} {label}: accuracy {e['overall']['accuracy']:.3f}, "
                      f"{e['overall']['tokens_mean']:.1f} tokens ({seconds:.0f} s)")
    return key, result, found_done


def timing_note(summary: dict[str, Any]) -> str:
    """How a resumed matrix's time was obtained (empty when it ran in one invocation)."""
    if summary.get("timed") == "record":
        return " (recorded when it ran; every run found done on resuming)"
    if summary.get("resumed"):
        return f" (the sum of its runs' recorded times; {len(summary['resumed'])} found done on resuming)"
    return ""


def _recorded_seconds(run_dir: Path, measured: float, fresh: bool) -> tuple[float, bool]:
    """The time a run (training and evaluation) took when it ran, and whether this invocation found
    it done. A run trained now records its measured time in its directory; a run found done reports
    the time recorded then (or, from before records were kept, this invocation's time)."""
    record = Path(run_dir) / "bench-seconds.json"
    if fresh:
        record.write_text(json.dumps({"seconds": measured}))
        return measured, False
    return (json.loads(record.read_text())["seconds"] if record.exists() else measured), True


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------


METRICS = {
    "accuracy": ("overall", "accuracy"),
    "tokens": ("overall", "tokens_mean"),
    "in_accuracy": ("in_domain", "accuracy"),
    "in_tokens": ("in_domain", "tokens_mean"),
    "held_accuracy": ("held_out", "accuracy"),
    "held_tokens": ("held_out", "tokens_mean"),
    "redundancy": ("overall", "redundancy"),
    "level1_tokens": ("by_level", "1", "tokens_mean"),
    "level4_accuracy": ("by_level", "4", "accuracy"),
    "tokens_per_correct": ("overall", "tokens_per_correct"),
    "overthinking_local": ("overall", "overthinking_tokens"),
    "overthinking_global": ("efficiency", "overthinking_global"),
    "underthinking": ("efficiency", "underthinking_pp"),
}


def method_samples_path(result: dict[str, Any], evaluation: dict) -> Path:
    """Where `evaluate_target` wrote the samples of a method's evaluation."""
    return Path(result["run_dir"]) / "eval" / f"{Path(evaluation['checkpoint']).name}.samples.jsonl"


def add_efficiency(start: dict, start_path: Path, results: dict[str, Any]) -> None:
    """The oracle-free measures across the matrix, into each evaluation's `efficiency`: global
    overthinking (tokens over the shortest correct answer to the same problem in any evaluation
    of the matrix, ThoughtTerminator's O_g) and underthinking (points of accuracy lost on the
    problems the start solved; taut.metrics). nan where a samples file is missing."""
    start_out = read_outcomes(Path(start_path).with_suffix(".samples.jsonl"))
    runs = [(e, read_outcomes(method_samples_path(r, e)) if "run_dir" in r and "checkpoint" in e else None)
            for r in results.values() for e in r["evals"].values()]
    shortest = shortest_correct(*(o for o in [start_out, *(o for _, o in runs)] if o is not None))
    for e, now in [(start, start_out), *runs]:
        lost = underthinking(start_out, now)[0] if start_out is not None and now is not None else math.nan
        e["efficiency"] = {"overthinking_global": overthinking(now, shortest) if now is not None else math.nan,
                           "underthinking_pp": 100 * lost}


def _get(e: dict, path: tuple) -> float:
    """The value at `path`; nan where an older evaluation lacks it."""
    for p in path:
        if not isinstance(e, dict) or e.get(p) is None:
            return math.nan
        e = e[p]
    return e


def summarise(start: dict, results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per method and evaluated label: mean and spread over seeds, changes vs the start."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results.values():
        for label, e in r["evals"].items():
            groups.setdefault((r["method"], label), []).append(e)
    rows = []
    base = {k: _get(start, p) for k, p in METRICS.items()}
    for (method, label), evals in groups.items():
        values = {k: [_get(e, p) for e in evals] for k, p in METRICS.items()}
        row = {"method": method if label == "final" else f"{method} ({label})", "seeds": len(evals)}
        for k, v in values.items():
            row[k] = statistics.fmean(v)
            row[f"{k}_spread"] = (max(v) - min(v)) / 2 if len(v) > 1 else None
        row["length_change"] = row["tokens"] / base["tokens"] - 1
        row["accuracy_change"] = row["accuracy"] - base["accuracy"]
        row["in_length_change"] = row["in_tokens"] / base["in_tokens"] - 1
        row["in_accuracy_change"] = row["in_accuracy"] - base["in_accuracy"]
        row["held_length_change"] = row["held_tokens"] / base["held_tokens"] - 1
        row["held_accuracy_change"] = row["held_accuracy"] - base["held_accuracy"]
        rows.append(row)
    return rows


def _figures(out: Path, results: dict[str, Any]) -> dict[str, Path]:
    """The comparison report over one seed of every method (the Pareto and dynamics figures)."""
    firsts: dict[str, str] = {}
    for r in results.values():
        firsts.setdefault(r["method"], r["run_dir"])
    report = compare([Path(d) for d in firsts.values()], out / "report", labels=list(firsts))
    return {name: report.parent / f"{name}.png" for name in ("accuracy_vs_tokens", "training_dynamics", "budget_accuracy",
                                                               "change_by_level", "transfer")}


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%"


def _pm(row: dict, key: str, scale: float = 1.0, digits: int = 3) -> str:
    spread = row.get(f"{key}_spread")
    value = f"{scale * row[key]:.{digits}f}"
    return value if spread is None else f"{value} ± {scale * spread:.{digits}f}"


def targets(rows: list[dict]) -> list[tuple[str, bool | None, str]]:
    """The claims we chase, checked mechanically against the table."""
    by = {r["method"]: r for r in rows}
    out = []
    m = by.get("mastery-curriculum")
    if m:
        out.append(("Mastery-gated curriculum ≥ 30% shorter than the start, accuracy within 1 point or better",
                    m["length_change"] <= -0.30 and m["accuracy_change"] >= -0.01,
                    f"{_pct(m['length_change'])} tokens, {100 * m['accuracy_change']:+.1f} points"))
        for name in ("dapo-lite", "dapo-heavy", "dler", "alp", "shorter-better"):
            d = by.get(name)
            if d:
                dominates = m["accuracy"] >= d["accuracy"] and m["tokens"] <= d["tokens"]
                out.append((f"Mastery-gated dominates {name} on the accuracy–tokens plane", dominates,
                            f"mastery {m['accuracy']:.3f} / {m['tokens']:.1f} tokens vs {d['accuracy']:.3f} / {d['tokens']:.1f}"))
        out.append(("Compression on training domains shortens held-out domains ≥ 20% with accuracy within 2 points",
                    m["held_length_change"] <= -0.20 and m["held_accuracy_change"] >= -0.02,
                    f"held-out {_pct(m['held_length_change'])} tokens, {100 * m['held_accuracy_change']:+.1f} points"))
    low = next((r for r in rows if r["method"].startswith("siri") and "low" in r["method"]), None)
    if low:
        out.append(("SIRI-low shorter and at least as accurate as the start",
                    low["length_change"] < 0 and low["accuracy_change"] >= 0,
                    f"{_pct(low['length_change'])} tokens, {100 * low['accuracy_change']:+.1f} points"))
    return out


def efficiency_table(start: dict, rows: list[dict]) -> list[str]:
    """The oracle-free measures beside the oracle's redundancy, and how well they track it."""
    def cell(value: float, digits: int = 1) -> str:
        return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"

    redundant = lambda r: r["redundancy"] * r["tokens"]            # noqa: E731  oracle: redundant tokens per response
    start_row = {"method": "start", "redundancy": _get(start, ("overall", "redundancy")),
                 "tokens": _get(start, ("overall", "tokens_mean")), **{k: _get(start, METRICS[k]) for k in
                 ("tokens_per_correct", "overthinking_local", "overthinking_global", "underthinking")}}
    lines = ["", "**Efficiency without an oracle, beside the oracle's redundancy** (taut.metrics, docs/evaluation.md):",
             "redundant tokens per response by the testbed's oracle; overthinking, local: mean tokens over the",
             "shortest correct sample of the same problem in the same evaluation; global: over the shortest correct",
             "answer to it in any evaluation of the matrix (ThoughtTerminator's measure, arXiv 2504.13367);",
             "underthinking: points of accuracy lost on the problems the start solved (ours, after OptimalThinkingBench).",
             "",
             "| method | redundancy (oracle) | redundant tokens (oracle) | overthinking, local | overthinking, global | tokens per correct | underthinking |",
             "|---|---|---|---|---|---|---|"]
    for r in [start_row, *rows]:
        lines.append(f"| {r['method']} | {cell(r['redundancy'], 2)} | {cell(redundant(r))} | {cell(r['overthinking_local'])} | "
                     f"{cell(r['overthinking_global'])} | {cell(r['tokens_per_correct'])} | {cell(r['underthinking'])} pts |")
    pairs = [(redundant(r), r["overthinking_global"], r["overthinking_local"]) for r in [start_row, *rows]]
    pairs = [p for p in pairs if not any(math.isnan(x) for x in p)]
    if len(pairs) >= 3:
        oracle, glob, local = zip(*pairs)
        lines += ["", f"Across these {len(pairs)} rows the oracle's redundant tokens correlate with global overthinking at "
                      f"r = {_pearson(oracle, glob):.2f} and with local overthinking at r = {_pearson(oracle, local):.2f} (Pearson)."]
    return lines


def _pearson(x: tuple[float, ...], y: tuple[float, ...]) -> float:
    try:
        return statistics.correlation(x, y)
    except statistics.StatisticsError:             # a constant column
        return math.nan


def write_benchmarks_md(path: Path, summary: dict[str, Any], figures: dict[str, Path]) -> None:
    path = Path(path)
    figure_dir = path.parent / "docs" / "figures"
    figure_dir.mkdir(parents=True, exist_ok=True)
    links = {}
    for name, src in figures.items():
        if src.exists():
            dest = figure_dir / f"bench-{name}.png"
            shutil.copy(src, dest)
            links[name] = dest.relative_to(path.parent)
    start = summary["start"]
    rows = sorted(summary["rows"], key=lambda r: r["method"])
    lines = [
        "# Benchmarks",
        "",
        "Every length-control method of taut on the built-in testbed, from one shared start, with the same",
        "rollout budget. Generated by the command below; the numbers are measured, not edited. The",
        "discussion at the end is written by hand and kept when the file is regenerated.",
        "",
        "```",
        summary["command"],
        "```",
        "",
        f"Full run: {summary['seconds'] / 60:.1f} minutes on this machine"
        + timing_note(summary)
        + f". Settings: {summary['config']['start_steps']} accuracy-RL steps",
        f"for the start, then {summary['config']['steps']} RL steps per method of {summary['config']['rl']['prompts_per_step']} prompts ×",
        f"{summary['config']['rl']['group_size']} rollouts (dynamic sampling off, so every method gets the same rollouts),",
        f"evaluated on the test split with {summary['config']['eval']['n_per_level']} problems per domain and level and",
        f"{summary['config']['eval']['samples']} samples each at temperature {summary['config']['eval']['temperature']}.",
        "Where a method ran with several seeds the table shows mean ± half the range.",
        "",
        f"**Start** (SFT + accuracy RL): accuracy {start['overall']['accuracy']:.3f}, {start['overall']['tokens_mean']:.1f} tokens,",
        f"redundancy {start['overall'].get('redundancy', 0):.2f}; in-domain {start['in_domain']['accuracy']:.3f} / "
        f"{start['in_domain']['tokens_mean']:.1f} tokens; held-out {start['held_out']['accuracy']:.3f} / {start['held_out']['tokens_mean']:.1f} tokens.",
        "",
        "| method | seeds | accuracy | tokens | length change | accuracy change | redundancy | level-1 tokens | level-4 accuracy | held-out accuracy change | held-out length change |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['seeds']} | {_pm(r, 'accuracy')} | {_pm(r, 'tokens', digits=1)} | {_pct(r['length_change'])} | "
            f"{100 * r['accuracy_change']:+.1f} pts | {_pm(r, 'redundancy', digits=2)} | {_pm(r, 'level1_tokens', digits=1)} | "
            f"{_pm(r, 'level4_accuracy')} | {100 * r['held_accuracy_change']:+.1f} pts | {_pct(r['held_length_change'])} |")
    lines += efficiency_table(start, rows)
    lines += ["", "## Targets", "", "| target | met | measured |", "|---|---|---|"]
    for claim, met, measured in targets(summary["rows"]):
        lines.append(f"| {claim} | {'yes' if met else 'no'} | {measured} |")
    lines += ["", "## Figures", ""]
    titles = {"accuracy_vs_tokens": "Accuracy against mean tokens (Pareto frontier dashed)",
              "training_dynamics": "Training dynamics", "budget_accuracy": "Accuracy under a token budget",
              "change_by_level": "Length and accuracy change per difficulty", "transfer": "In-domain vs held-out"}
    for name, link in links.items():
        lines += [f"**{titles.get(name, name)}**", "", f"![{name}]({link})", ""]
    discussion = "## Discussion\n\n(to be written after reading the numbers)\n"
    after = ""                  # sections after the discussion (benchmark suites) are kept as they are
    if path.exists() and DISCUSSION_START in path.read_text():
        text = path.read_text()
        discussion = text[text.index(DISCUSSION_START) + len(DISCUSSION_START): text.index(DISCUSSION_END)].strip("\n") + "\n"
        after = text[text.index(DISCUSSION_END) + len(DISCUSSION_END):].strip("\n")
    lines += [DISCUSSION_START, discussion, DISCUSSION_END, ""]
    if after:
        lines += [after, ""]
    path.write_text("\n".join(lines))

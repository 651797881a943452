"""The `taut` command line: thin commands over library functions."""

from __future__ import annotations

import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from taut.config import ConfigError, RunConfig, load_config, to_yaml

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="taut: RL post-training that makes reasoning models think tightly.")
data_app = typer.Typer(no_args_is_help=True, help="The built-in testbed's data.")
app.add_typer(data_app, name="data")
bench_app = typer.Typer(help="Benchmarks: the method matrix (default) and trainer throughput (speed).")
app.add_typer(bench_app, name="bench")
out_console = Console()
err_console = Console(stderr=True)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML recipe")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="override: key.path=value (repeatable)")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="run directory")]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="validate and print the resolved config, do not run")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress display")]


def _config(path: Path | None, overrides: list[str] | None) -> RunConfig:
    try:
        return load_config(path, overrides or [])
    except (ConfigError, FileNotFoundError) as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None


def _print_config(config: RunConfig) -> None:
    out_console.print(Syntax(to_yaml(config), "yaml", background_color="default"))


@app.command()
def sft(config: ConfigOpt = None, set: SetOpt = None, out: OutOpt = None, dry_run: DryOpt = False,
        resume: Annotated[Optional[Path], typer.Option(help="continue this run directory")] = None, quiet: QuietOpt = False):
    """Supervised cold start on the SFT tasks."""
    from taut.runlog import default_run_dir
    from taut.sft import train_sft

    if resume is not None:
        config = config or resume / "config.yaml"
    cfg = _config(config, set)
    if dry_run:
        _print_config(cfg)
        return
    train_sft(cfg, resume or out or default_run_dir("sft"), resume=resume is not None, quiet=quiet)


@app.command()
def train(config: ConfigOpt = None, set: SetOpt = None, out: OutOpt = None, dry_run: DryOpt = False,
          resume: Annotated[Optional[Path], typer.Option(help="continue this run directory")] = None, quiet: QuietOpt = False):
    """RL training (GRPO with the recipe's length strategy)."""
    from taut.rl.trainer import train_rl
    from taut.runlog import default_run_dir

    if resume is not None:
        config = config or resume / "config.yaml"
    cfg = _config(config, set)
    if dry_run:
        _print_config(cfg)
        out_console.print(plan_table(cfg))
        return
    train_rl(cfg, resume or out or default_run_dir("train"), resume=resume is not None, quiet=quiet)


def plan_table(cfg: RunConfig) -> Table:
    """The resolved RL plan: phases, their steps, strategies, stop rules and samplers."""
    t = Table(title=f"plan: {cfg.rl_steps()} RL steps" + (f", validation every {cfg.validation.every}" if cfg.validation.every else ""))
    for col in ("phase", "steps", "strategy", "stop rules", "rollback", "sampler", "lr"):
        t.add_column(col)
    start = 0
    for p in cfg.plan():
        params = {k: v for k, v in p.strategy.model_dump().items() if k != "name"}
        stops = ", ".join(f"{k}={v}" for k, v in p.stop.model_dump().items() if v is not None and k not in ("patience", "window"))
        t.add_row(p.name, f"{start}–{start + p.steps} ({p.steps})",
                  p.strategy.name + (" " + ", ".join(f"{k}={v}" for k, v in params.items()) if params else ""),
                  stops or "-", f"{p.rollback.criterion} (±{p.rollback.tolerance})" if stops else "-",
                  "epochs" if p.sampler.mastered_fraction is None else f"mastered share {p.sampler.mastered_fraction}",
                  str(p.lr or cfg.rl.lr))
        start += p.steps
    return t


@app.command("eval")
def eval_cmd(
    target: Annotated[Path, typer.Argument(help="run directory (its chosen checkpoint) or model directory")],
    config: ConfigOpt = None, set: SetOpt = None,
    tasks: Annotated[Optional[str], typer.Option(help="comma-separated task specs, e.g. gym:add,gym:held-out")] = None,
    samples: Annotated[Optional[int], typer.Option(help="samples per problem")] = None,
    out: Annotated[Optional[Path], typer.Option(help="JSON file (default: RUN/eval/<checkpoint>.json)")] = None,
    quiet: QuietOpt = False,
):
    """Accuracy, tokens and budgets per domain and difficulty; writes JSON and prints a table."""
    from taut.workflows import evaluate_target

    if config is None and (target / "config.yaml").exists():
        config = target / "config.yaml"
    overrides = [f"model.path={target}", "model.preset=null", *(set or [])]   # the model is the target
    if tasks:
        overrides.append(f"eval.tasks={json.dumps(tasks.split(','))}")
    if samples:
        overrides.append(f"eval.samples={samples}")
    cfg = _config(config, overrides)
    result, path = evaluate_target(cfg, target, out)
    if not quiet:
        from taut.evaluate import table

        out_console.print(table(result, title=f"eval {result['checkpoint']}"))
    out_console.print(f"written: {path}")


@app.command()
def demo(out: OutOpt = None, set: SetOpt = None, quiet: QuietOpt = False,
         config: Annotated[Path, typer.Option("--config", "-c")] = Path("recipes/demo.yaml")):
    """The shipped SFT checkpoint → an accuracy phase → a compression phase on the testbed,
    evaluated at each stage, then the report."""
    from taut.workflows import run_demo

    if not config.exists():
        err_console.print(f"[red]error:[/red] {config} not found: run from the repository root or pass --config")
        raise typer.Exit(2)
    run_demo(_config(config, set), out, quiet=quiet)


@app.command()
def strategies(as_json: Annotated[bool, typer.Option("--json", help="machine-readable list")] = False):
    """The length-control strategies and what they do."""
    from taut.length import REGISTRY

    if as_json:
        print(json.dumps([{"name": n, "summary": e.summary, "source": e.source,
                           "defaults": e.config().model_dump(mode="json")} for n, e in REGISTRY.items()], indent=1))
        return
    t = Table(title="length strategies")
    for col in ("name", "what it does", "source"):
        t.add_column(col)
    for name, e in REGISTRY.items():
        t.add_row(name, e.summary, e.source)
    out_console.print(t)


@data_app.command("preview")
def data_preview(domain: str, difficulty: Annotated[int, typer.Option("--difficulty", "-d")] = 1,
                 n: Annotated[int, typer.Option("-n", help="examples")] = 3, seed: int = 0):
    """Print testbed examples with their oracle (minimal response, necessary length)."""
    from taut.workflows import preview

    try:
        out_console.print(preview(domain.removeprefix("gym:"), difficulty, n, seed), highlight=False)
    except ValueError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None


@data_app.command("health")
def data_health(target: Annotated[Path, typer.Argument(help="run or model directory")], config: ConfigOpt = None,
                set: SetOpt = None, as_json: Annotated[bool, typer.Option("--json")] = False):
    """Forced-thinking vs forced-direct accuracy per level, and accuracy with vs without post-answer rounds."""
    from taut.workflows import forced_decisions

    result = forced_decisions(_config(config, set), target)
    if as_json:
        print(json.dumps(result, indent=1))
        return
    t = Table(title=f"testbed health: {result['checkpoint']}")
    for col in ("level", "own choice", "thinking forced", "direct forced", "thinks", "with rounds", "without rounds"):
        t.add_column(col, justify="right")
    for level, r in result["by_level"].items():
        t.add_row(level, f"{r['free_accuracy']:.3f}", f"{r['think_accuracy']:.3f}", f"{r['direct_accuracy']:.3f}",
                  f"{r['thinks_rate']:.2f}", f"{r['accuracy_with_rounds']:.3f}", f"{r['accuracy_without_rounds']:.3f}")
    out_console.print(t)


@data_app.command("stats")
def data_stats(as_json: Annotated[bool, typer.Option("--json")] = False, config: ConfigOpt = None, set: SetOpt = None,
               n: Annotated[int, typer.Option("-n", help="traces per domain and level")] = 400):
    """Per domain and difficulty: SFT trace length, necessary length, redundancy, held out."""
    from taut.workflows import data_stats as stats

    result = stats(_config(config, set), n)
    if as_json:
        print(json.dumps(result, indent=1))
        return
    t = Table(title=f"testbed SFT mixture (redundant tokens overall: {result['mixture_redundancy']:.1%})")
    for col in ("domain", "level", "held out", "trace tokens", "necessary", "redundancy", "steps"):
        t.add_column(col)
    for row in result["cells"]:
        t.add_row(row["domain"], str(row["difficulty"]), "yes" if row["held_out"] else "", f"{row['trace_tokens_mean']:.1f}",
                  f"{row['necessary_tokens_mean']:.1f}", f"{row['redundancy']:.1%}", f"{row['necessary_steps_mean']:.1f}")
    out_console.print(t)


@app.command()
def compare(
    runs: Annotated[list[Path], typer.Argument(help="run directories with evaluations under RUN/eval/")],
    out: Annotated[Path, typer.Option("--out", help="report directory (report.html, report.json, PNGs)")],
    label: Annotated[Optional[list[str]], typer.Option("--label", help="name per run, in order (repeatable)")] = None,
):
    """Compare runs: accuracy vs tokens with the Pareto frontier, budgets, training dynamics; writes report.html."""
    from taut.report import compare as write_comparison
    from taut.report.summary import rich_table

    path = write_comparison(runs, out, labels=label)
    out_console.print(rich_table(json.loads((path.parent / "report.json").read_text())["table"]))
    out_console.print(f"written: {path}")


@bench_app.callback(invoke_without_command=True)
def bench(ctx: typer.Context,
          config: Annotated[Path, typer.Option("--config", "-c", help="bench recipe")] = Path("recipes/bench.yaml"),
          quick: Annotated[bool, typer.Option("--quick", help="a few steps per method: a smoke run in minutes")] = False,
          out: OutOpt = None,
          write: Annotated[Optional[Path], typer.Option(help="write this BENCHMARKS.md (default: BENCHMARKS.md, not with --quick)")] = None,
          suite: Annotated[Optional[str], typer.Option(help="run the suite recipes/bench-SUITE.yaml; writes its BENCHMARKS.md section")] = None):
    """Every method from one shared start with the same rollout budget; writes BENCHMARKS.md."""
    if ctx.invoked_subcommand is not None:
        return
    from taut.bench.matrix import load_bench, run_bench

    if suite is not None:
        from taut.bench.suite import load_suite, run_suite, suite_path

        path = suite_path(suite)
        out = out or Path("runs") / (f"bench-{suite}-quick" if quick else f"bench-{suite}")
        target = write or (None if quick else Path("BENCHMARKS.md"))
        summary = run_suite(load_suite(path, quick=quick), out, target,
                            f"taut bench --suite {suite}" + (" --quick" if quick else "") + f" --out {out}")
        t = Table(title=f"bench --suite {suite} ({summary['seconds'] / 60:.1f} min)")
        for col in ("method", "seeds", "accuracy", "tokens", "search accuracy", "search tokens"):
            t.add_column(col, justify="right")
        for r in sorted(summary["suite"]["rows"], key=lambda r: r["method"]):
            t.add_row(r["method"], str(r["seeds"]), f"{r['accuracy']:.3f}", f"{r['tokens']:.1f}",
                      "–" if r["search_accuracy"] is None else f"{r['search_accuracy']:.3f}",
                      "–" if r["search_tokens"] is None else f"{r['search_tokens']:.1f}")
        out_console.print(t)
        out_console.print(f"results: {out / 'suite.json'}" + (f"; {target}" if target else ""))
        return

    bench_cfg = load_bench(config, quick=quick)
    out = out or Path("runs") / ("bench-quick" if quick else "bench")
    command = f"taut bench --config {config}" + (" --quick" if quick else "") + f" --out {out}"
    target = write or (None if quick else Path("BENCHMARKS.md"))
    summary = run_bench(bench_cfg, out, target, command)
    t = Table(title=f"bench ({summary['seconds'] / 60:.1f} min)")
    for col in ("method", "seeds", "accuracy", "tokens", "length Δ", "accuracy Δ", "held-out length Δ", "held-out accuracy Δ"):
        t.add_column(col, justify="right")
    for r in sorted(summary["rows"], key=lambda r: r["method"]):
        t.add_row(r["method"], str(r["seeds"]), f"{r['accuracy']:.3f}", f"{r['tokens']:.1f}", f"{100 * r['length_change']:+.1f}%",
                  f"{100 * r['accuracy_change']:+.1f}", f"{100 * r['held_length_change']:+.1f}%", f"{100 * r['held_accuracy_change']:+.1f}")
    out_console.print(t)
    out_console.print(f"results: {out / 'bench.json'}" + (f"; {target}" if target else ""))


@bench_app.command("speed")
def bench_speed(vs: Annotated[Optional[str], typer.Option("--vs", help="compare against: trl")] = None,
                pairs: Annotated[int, typer.Option(help="interleaved A/B pairs per mode")] = 5,
                steps: Annotated[int, typer.Option(help="timed steps per run (after one warm-up step)")] = 5,
                threads: int = 2, max_new_tokens: int = 128,
                modes: Annotated[str, typer.Option(help="natural,forced")] = "natural,forced",
                model: str = "builtin:testbed-sft",
                out: Annotated[Path, typer.Option(help="JSON results")] = Path("runs/bench-speed.json")):
    """Trainer throughput on the identical workload, taut vs TRL, interleaved A/B/A/B."""
    from taut.bench.speed import Workload, run_pair_series

    sides = ("taut", vs) if vs else ("taut",)
    if vs not in (None, "trl"):
        err_console.print(f"[red]error:[/red] --vs {vs!r}: only trl is supported")
        raise typer.Exit(2)
    results = {}
    for mode in modes.split(","):
        w = Workload(model=model, max_new_tokens=max_new_tokens, forced=mode == "forced", threads=threads, steps=steps)
        out_console.print(f"[bold]{mode}[/bold] lengths, {pairs} pair(s)")
        results[mode] = run_pair_series(w, pairs, sides, log=out_console.print)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    from taut.bench.speed import median_of

    t = Table(title="throughput (medians over runs)")
    for col in ("mode", "side", "steps/s", "rollout tok/s", "generation s", "log-probs s", "backward+opt s", "rewards s", "peak RSS MB"):
        t.add_column(col, justify="right")
    for mode, r in results.items():
        for side, runs in r["runs"].items():
            split = {k: statistics.median(x["split_s_per_step"][k] for x in runs) for k in runs[0]["split_s_per_step"]}
            t.add_row(mode, side, f"{median_of(runs, 'steps_per_s'):.3f}", f"{median_of(runs, 'rollout_tokens_per_s'):.0f}",
                      *(f"{v:.3f}" for v in split.values()), f"{median_of(runs, 'peak_rss_mb'):.0f}")
        if "ratio" in r:
            ratio = r["ratio"]
            t.add_row(mode, f"taut/{vs}", f"{ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f})", "", "", "", "", "", "")
    out_console.print(t)
    out_console.print(f"written: {out}")


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except (ConfigError, FileNotFoundError, ValueError) as err:
        err_console.print(f"[red]error:[/red] {err}")
        sys.exit(2)


if __name__ == "__main__":
    main()

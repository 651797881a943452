"""The `taut` command line: thin commands over library functions."""

from __future__ import annotations

import json
import logging
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
        return
    train_rl(cfg, resume or out or default_run_dir("train"), resume=resume is not None, quiet=quiet)


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
    overrides = list(set or [])
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
    """SFT checkpoint → GRPO → eval on the testbed, with a before/after table."""
    from taut.workflows import run_demo

    if not config.exists():
        from importlib.resources import files

        config = Path(str(files("taut") / "recipes" / "demo.yaml"))
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


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except (ConfigError, FileNotFoundError, ValueError) as err:
        err_console.print(f"[red]error:[/red] {err}")
        sys.exit(2)


if __name__ == "__main__":
    main()

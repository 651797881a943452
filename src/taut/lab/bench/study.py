"""Studies on real weights whose cells are committed: methods × seeds from one SFT-made start, run
over several sittings, reported from the committed results alone (`taut bench --suite real`).

A study recipe is `recipes/bench-NAME.yaml` with `study: NAME` (a suite recipe has `suite:`):

    study: real                   names the BENCHMARKS.md section it writes
    title: …
    prepare: make written-start   the command that builds the start
    base: builtin:real/…          the recipe every cell is made from (model, data, rl, eval)
    start: runs/written/sft       the model every cell starts from (a run stands for its chosen checkpoint)
    results: results/real         one folder per cell, committed: METHOD/seedS/
    seeds: [0, 1, 2]
    set: {rl: {steps: 12}}        fields over the base for every cell (the shared rollout budget)
    evals:                        evaluation modes, each a set of `eval` fields
      greedy: {temperature: 0, samples: 1}
    trained: [columns, stories]   the families RL trains on; held_out: evaluated only
    held_out: [times]
    gates: [gate, gate-6of8]      the methods set against each of `penalties` on the hardest level
    penalties: [siri, dapo, dler, alp, gate-off]
    methods:
      - name: siri
        set: {strategy: {name: siri, …}}

A cell is one `taut train` and one `taut eval` per mode, each printed before it runs. Its folder
holds what the report needs and nothing heavy: the config it ran (config.yaml), its metrics
(metrics.jsonl), each mode's evaluation (MODE.json), every sample's outcome without its text
(MODE.outcomes.jsonl.gz: for the efficiency measures) and one response per family and level
(MODE.examples.jsonl), and its timings (cell.json). A cell whose files are all there is not run
again. A seed draws its own test problems, so three seeds of 100 problems per level make 300 per
method and level, and the methods of one seed meet the same problems; the start is evaluated at
`start_seeds` with `start_eval` (the real study: 300 problems on each seed's draw). Checkpoints stay under the run folder (runs/…), never committed.

`--report` writes the BENCHMARKS.md section from the committed cells alone, running nothing.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import math
import shutil
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from taut.builtin_recipes import resolve_recipe
from taut.checkpoint import chosen_checkpoint, list_checkpoints, run_finished
from taut.config import ConfigError, RunConfig, read_yaml, to_yaml
from taut.evaluate import read_outcomes
from taut.lab.bench.suite import write_section
from taut.lab.commands import CommandFailed, run_taut
from taut.metrics import overthinking, shortest_correct, underthinking
from taut.models.loading import resolve_model_path
from taut.models.policy import ADAPTER_DIR
from taut.rundir import run_files
from taut.schema import Strict

CELL_FILES = ("config.yaml", "cell.json")
TEXT_FIELDS = ("text", "scores")          # dropped from the committed outcomes
EXAMPLE_FIELDS = ("problem_id", "domain", "difficulty", "correct", "length", "redundant_tokens", "necessary_length", "text")


class StudyMethod(Strict):
    name: str
    seeds: list[int] | None = Field(None, min_length=1, description="this method's seeds (default: the study's); more "
                                    "where a comparison needs the power")
    set: dict[str, Any] = Field(default_factory=dict, description="run fields over the study's (strategy, phases, …)")


class Study(Strict):
    study: str
    title: str
    prepare: str | None = None
    base: str = Field(description="the recipe every cell is made from")
    start: str = Field(description="model.path of every cell: the SFT-made start")
    results: str = Field(description="the committed per-cell folder, relative to the working directory")
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    start_seeds: list[int] | None = Field(None, description="the seeds the start is evaluated with (default: every seed)")
    start_eval: dict[str, Any] = Field(default_factory=dict, description="eval fields of the start's cells (e.g. n_per_level: 300)")
    workers: int = Field(1, ge=1, description="cells run side by side, each in its own process")
    threads: int = Field(1, ge=1, description="model.threads of each cell")
    set: dict[str, Any] = Field(default_factory=dict)
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict, description="method → fields over its own (for quick runs)")
    evals: dict[str, dict[str, Any]] = Field(min_length=1)
    trained: list[str] = Field(min_length=1)
    held_out: list[str] = Field(default_factory=list)
    gates: list[str] = Field(default_factory=list, description="the methods compared with each of `penalties`")
    penalties: list[str] = Field(default_factory=list)
    methods: list[StudyMethod] = Field(min_length=1)


@dataclass(frozen=True)
class Cell:
    method: str                 # "start" for the start's evaluations
    seed: int

    @property
    def key(self) -> str:
        return f"{self.method}/seed{self.seed}"


def is_study(path: Path) -> bool:
    raw = read_yaml(path)
    return isinstance(raw, dict) and "study" in raw


def load_study(path: Path, quick: bool = False) -> Study:
    """The study recipe at `path`, its `quick:` overrides merged in when `quick`."""
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a study recipe is a mapping with study, title, base, start, results and methods")
    quick_overrides = raw.pop("quick", {}) or {}
    if quick:
        raw = merge(raw, quick_overrides)
        for method in raw.get("methods") or []:      # a smoke runs the study's seeds only
            if isinstance(method, dict):
                method.pop("seeds", None)
    try:
        study = Study.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{path}{' (quick)' if quick else ''}: {err}") from None
    names = [m.name for m in study.methods]
    if "start" in names or len(set(names)) != len(names):
        raise ConfigError(f"{path}: methods: names must be distinct and not 'start', got {names}")
    for field, wanted in (("gates", study.gates), ("penalties", study.penalties),
                          ("overrides", list(study.overrides))):
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise ConfigError(f"{path}: {field}: no method {', '.join(map(repr, unknown))} (methods: {', '.join(names)})")
    return study


def merge(a: Any, b: Any) -> Any:
    """`b` over `a`: mappings merged key by key, anything else (lists included) replaced."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(a.get(k), v) if k in a else copy.deepcopy(v)
        return out
    return copy.deepcopy(b)


def cell_config(study: Study, method: StudyMethod | None, seed: int) -> RunConfig:
    """The run config of one cell: the base recipe, the study's fields, the method's, the seed,
    the start and the thread count."""
    raw = read_yaml(resolve_recipe(study.base))
    raw = merge(raw, study.set)
    if method is not None:
        raw = merge(merge(raw, method.set), study.overrides.get(method.name, {}))
    else:
        raw = merge(raw, {"eval": study.start_eval})
    if "phases" in raw:                       # a curriculum's steps are its phases'
        raw.setdefault("rl", {})["steps"] = None
    raw = merge(raw, {"seed": seed, "model": {"path": study.start, "threads": study.threads}})
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"study {study.study}, method {method.name if method else 'start'}: {err}") from None


# ---------------------------------------------------------------------------------------------
# running the cells
# ---------------------------------------------------------------------------------------------


def cell_dir(results: Path, cell: Cell) -> Path:
    return results / cell.method / f"seed{cell.seed}"


def cell_done(study: Study, results: Path, cell: Cell, start: str | None = None) -> bool:
    """Whether the cell's files are all there (and, given the start's fingerprint, come from it)."""
    folder = cell_dir(results, cell)
    wanted = [*CELL_FILES, *(f"{m}.json" for m in study.evals), *(f"{m}.outcomes.jsonl.gz" for m in study.evals)]
    if not all((folder / name).is_file() for name in wanted):
        return False
    return start is None or cell_start(folder) == start


def cell_start(folder: Path) -> str | None:
    return json.loads((folder / "cell.json").read_text()).get("start_fingerprint")


def start_fingerprint(path: str) -> str:
    """A short hash of the start's weights (its model and adapter safetensors): a cell made from
    other weights under the same name is not this study's."""
    where = Path(resolve_model_path(path))
    files = [f for f in (where / "model.safetensors", where / ADAPTER_DIR / "adapter_model.safetensors") if f.is_file()]
    digest = hashlib.blake2b(digest_size=8)
    for f in files or sorted(p for p in where.rglob("*") if p.is_file()):
        with open(f, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def taut_command(*args: str, log: Path) -> float:
    """Run one taut command (taut.lab.commands.run_taut; its output appended to `log`); its wall seconds."""
    try:
        return run_taut(*args, log=log, append=True)[0]
    except CommandFailed as err:
        raise StudyError(f"a command of the study failed: {err}") from None


class StudyError(RuntimeError):
    """A command of a study cell failed (its output is in the cell's log)."""


def run_cell(study: Study, results: Path, runs: Path, cell: Cell, start: str) -> dict[str, Any]:
    """Train (unless it is the start) and evaluate one cell; its small files are gathered beside the
    run (RUN/study-cell/) and moved into `results` only when all are there, so that the committed
    tree never holds half a cell. `start` is the start's fingerprint: files and runs made from other
    weights are discarded."""
    method = None if cell.method == "start" else next(m for m in study.methods if m.name == cell.method)
    config = cell_config(study, method, cell.seed)
    folder, run = cell_dir(results, cell), runs / cell.method / f"seed{cell.seed}"
    marker = run / "study-start.txt"
    if (folder / "cell.json").is_file() and cell_start(folder) != start:
        shutil.rmtree(folder)
    if run.is_dir() and (not marker.is_file() or marker.read_text().strip() != start):
        shutil.rmtree(run)
    stage = run / "study-cell"
    stage.mkdir(parents=True, exist_ok=True)
    marker.write_text(start + "\n")
    config_path = stage / "config.yaml"
    config_path.write_text(to_yaml(config))
    log = run.parent / f"seed{cell.seed}.log"
    record_path = stage / "cell.json"        # written after each command: a cell finished in pieces keeps their timings
    record: dict[str, Any] = json.loads(record_path.read_text()) if record_path.is_file() else {
        "method": cell.method, "seed": cell.seed, "threads": study.threads, "start_fingerprint": start,
        "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M"), "eval_seconds": {}}
    if method is None:
        target = study.start
    else:
        target = str(run)
        if not run_finished(run):
            resume = bool(list_checkpoints(run))        # a run stopped before its first checkpoint starts again
            fresh = ["--config", str(config_path), "--out", str(run), *(["--overwrite"] if run_files(run) else [])]
            record["train_seconds"] = taut_command("train", *(["--resume", str(run)] if resume else fresh), log=log)
            record["resumed"] = resume
            record_path.write_text(json.dumps(record, indent=1))
        for name in ("metrics.jsonl", "curriculum.json", "selection.json"):
            if (run / name).is_file():
                (stage / name).write_bytes((run / name).read_bytes())
    for mode, fields in study.evals.items():
        out = run / "eval" / f"{mode}.json"
        if not out.is_file():
            sets = [a for k, v in fields.items() for a in ("--set", f"eval.{k}={json.dumps(v)}")]
            wall = taut_command("eval", target, "--config", str(config_path), *sets, "--out", str(out), log=log)
            # a resumed evaluation (its journal, taut.evaluate.Journal): the killed processes' time too
            record["eval_seconds"][mode] = wall + (json.loads(out.read_text()).get("eval_seconds_resumed") or 0.0)
            record_path.write_text(json.dumps(record, indent=1))
        keep_evaluation(out, stage, mode)
    record_path.write_text(json.dumps(record, indent=1))
    publish(stage, folder)
    if method is not None:
        drop_spent_checkpoints(run)
    return record


def drop_spent_checkpoints(run: Path) -> None:
    """Once a trained cell is published, keep only the checkpoint it stands for: the others (536–573 MB
    each here: the merged model, the adapter and its optimizer) are read by nothing again, and
    eleven cells' worth held 27 GB."""
    keep = chosen_checkpoint(run)
    for path in list_checkpoints(run):
        if path != keep:
            shutil.rmtree(path)


def publish(stage: Path, folder: Path) -> None:
    """Replace `folder` with a copy of the finished cell in `stage` (copied aside, then renamed)."""
    aside = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(aside, ignore_errors=True)
    shutil.copytree(stage, aside)
    if folder.exists():
        shutil.rmtree(folder)
    aside.rename(folder)


def keep_evaluation(report: Path, folder: Path, mode: str) -> None:
    """Copy an evaluation into the cell's folder: its report, its outcomes without text, one
    response per family and level."""
    (folder / f"{mode}.json").write_bytes(report.read_bytes())
    samples = report.with_suffix(".samples.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    with gzip.open(folder / f"{mode}.outcomes.jsonl.gz", "wt") as f:
        for row in rows:
            f.write(json.dumps({k: v for k, v in row.items() if k not in TEXT_FIELDS}) + "\n")
    seen: set[tuple] = set()
    with open(folder / f"{mode}.examples.jsonl", "w") as f:
        for row in rows:
            key = (row.get("domain"), row.get("difficulty"))
            if key not in seen:
                seen.add(key)
                f.write(json.dumps({k: row.get(k) for k in EXAMPLE_FIELDS}) + "\n")


def start_seeds(study: Study) -> list[int]:
    return study.start_seeds if study.start_seeds is not None else study.seeds


def method_seeds(study: Study, method: StudyMethod) -> list[int]:
    return method.seeds if method.seeds is not None else study.seeds


def all_cells(study: Study) -> list[Cell]:
    """The start's cells, then seed by seed (the study's, then any further seed a method names) each
    method that runs it, in the recipe's order."""
    seeds = list(dict.fromkeys([*study.seeds, *(s for m in study.methods for s in method_seeds(study, m))]))
    return [Cell("start", s) for s in start_seeds(study)] + [Cell(m.name, s) for s in seeds for m in study.methods
                                                            if s in method_seeds(study, m)]


def run_study(study: Study, results: Path, runs: Path, restart: bool = False) -> list[dict[str, Any]]:
    """Every cell whose files are missing, `study.workers` at a time; the start's first. Cells
    made from other weights than the start's now are refused (a start rebuilt on another machine
    need not be the same bit for bit), unless `restart`: then they are made again from it."""
    results, runs = Path(results), Path(runs)
    cells = all_cells(study)
    if not _start_exists(study.start):
        todo = [c for c in cells if not cell_done(study, results, c)]
        if todo:
            hint = f"; build it first: {study.prepare}" if study.prepare else ""
            raise ConfigError(f"study {study.study}: start {study.start!r} does not exist{hint}")
        return []
    start = start_fingerprint(study.start)
    others = sorted({cell_start(cell_dir(results, c)) for c in cells if cell_done(study, results, c)} - {start}, key=str)
    if others and not restart:
        raise ConfigError(f"study {study.study}: the cells under {results} were made from another start ({', '.join(map(str, others))}) "
                          f"than {study.start} now holds ({start}); they are kept. Bring back the start they were made from, "
                          f"or make every cell again from this one with --restart (the cells made from the other are replaced)")
    todo = [c for c in cells if not cell_done(study, results, c, start)]
    print(f"study {study.study}: {len(cells) - len(todo)} of {len(cells)} cells done in {results} (start {start}); "
          f"running {len(todo)}", flush=True)
    with ThreadPoolExecutor(max_workers=study.workers) as pool:
        return list(pool.map(lambda c: run_cell(study, results, runs, c, start), todo))


def _start_exists(path: str) -> bool:
    try:
        resolve_model_path(path)
    except FileNotFoundError:
        return Path(path).is_dir()
    return True


# ---------------------------------------------------------------------------------------------
# reading the committed cells
# ---------------------------------------------------------------------------------------------


def read_cells(study: Study, results: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """method → seed → {"evals": {mode: report}, "outcomes": {mode: path}, "cell": cell.json} for
    every complete cell under `results` made from the same start as the start's cell (incomplete
    cells, and cells of another start, are left out: listed as not yet run)."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    complete = [c for c in all_cells(study) if cell_done(study, results, c)]
    starts = [cell_start(cell_dir(results, c)) for c in complete if c.method == "start"]
    reference = starts[0] if starts else None
    for cell in complete:
        if reference is not None and cell_start(cell_dir(results, cell)) != reference:
            continue                          # made from other weights than the start's cell: not read
        folder = cell_dir(results, cell)
        out.setdefault(cell.method, {})[cell.seed] = {
            "evals": {m: json.loads((folder / f"{m}.json").read_text()) for m in study.evals},
            "outcomes": {m: folder / f"{m}.outcomes.jsonl.gz" for m in study.evals},
            "cell": json.loads((folder / "cell.json").read_text()),
            "examples": {m: [json.loads(line) for line in (folder / f"{m}.examples.jsonl").read_text().splitlines() if line.strip()]
                         for m in study.evals if (folder / f"{m}.examples.jsonl").is_file()},
        }
    return out


def example_responses(study: Study, cells: dict[str, dict[int, dict]], mode: str = "greedy") -> list[str]:
    """Markdown: each method's response to the same problem (the first of its draw) of the first
    trained family at its easiest and hardest level — what a method keeps and what it cuts."""
    seed = start_seeds(study)[0]
    methods = [m for m in ["start", *(m.name for m in study.methods)] if seed in cells.get(m, {})]
    if not methods or not study.trained:
        return []
    family = study.trained[0]
    levels = sorted({e["difficulty"] for m in methods for e in cells[m][seed]["examples"].get(mode, []) if e["domain"] == family})
    lines = [f"### Example responses ({mode}, seed {seed})", "",
             f"Each method's response to the same {family} problem — the first of seed {seed}'s draw — at level "
             f"{' and '.join(str(lv) for lv in levels[:1] + levels[-1:] if levels)}: whether it is right, its tokens and the "
             "oracle's necessary tokens, and the text (from the committed `*.examples.jsonl`).", ""]
    for level in dict.fromkeys(levels[:1] + levels[-1:]):
        lines += [f"**{family}, level {level}**", ""]
        for m in methods:
            example = next((e for e in cells[m][seed]["examples"].get(mode, []) if e["domain"] == family and e["difficulty"] == level), None)
            if example is None:
                continue
            summary = (f"{m}: {'right' if example['correct'] else 'wrong'}, {example['length']} tokens "
                       f"({example['necessary_length']} necessary)")
            lines += ["<details>", f"<summary>{summary}</summary>", "", "```", example["text"].strip(), "```", "", "</details>", ""]
    return lines


def pooled(reports: list[dict], families: list[str], level: int | None) -> dict[str, float | None]:
    """One method's numbers over its seeds on `families` (at `level`, or every level): means weighted
    by samples, and the binomial standard error of the pooled accuracy."""
    cells = [c for r in reports for key, c in r["by_cell"].items()
             if key.split("/")[0] in families and (level is None or key.split("/")[1] == str(level)) and c.get("n_samples")]
    n = sum(c["n_samples"] for c in cells)
    if not n:
        return {"n": 0, "accuracy": None, "se": None, "tokens": None, "redundancy": None, "necessary": None,
                "direct": None, "tokens_per_correct": None}

    def wmean(key: str) -> float | None:
        pairs = [(c[key], c["n_samples"]) for c in cells if c.get(key) is not None]
        total = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / total if total else None

    accuracy = wmean("accuracy")
    tokens = wmean("tokens_mean")
    redundant = wmean("redundant_tokens_mean")
    thinks = wmean("thinks_rate")
    return {"n": n, "accuracy": accuracy, "se": math.sqrt(accuracy * (1 - accuracy) / n), "tokens": tokens,
            "redundancy": None if redundant is None or not tokens else redundant / tokens,
            "necessary": wmean("necessary_tokens_mean"), "direct": None if thinks is None else 1 - thinks,
            "tokens_per_correct": tokens / accuracy if accuracy else None}


def efficiency(cells: dict[str, dict[int, dict]], mode: str) -> dict[str, dict[str, float]]:
    """Per method, means over seeds: global overthinking (tokens over the shortest correct
    response to the same problem among every evaluation of that seed, ThoughtTerminator's O_g)
    and underthinking (points lost on the problems the start solved; taut.metrics)."""
    per_method: dict[str, list[tuple[float, float]]] = {}
    seeds = sorted({s for by_seed in cells.values() for s in by_seed})
    for seed in seeds:
        present = {m: read_outcomes(by_seed[seed]["outcomes"][mode]) for m, by_seed in cells.items() if seed in by_seed}
        if "start" not in present:
            continue
        shortest = shortest_correct(*present.values())
        for m, now in present.items():
            per_method.setdefault(m, []).append((overthinking(now, shortest), 100 * underthinking(present["start"], now)[0]))
    return {m: {"overthinking": sum(o for o, _ in v) / len(v), "underthinking_pp": sum(u for _, u in v) / len(v)}
            for m, v in per_method.items()}


def compare(a: dict, b: dict) -> dict[str, Any] | None:
    """a − b in accuracy with the error bar 2·√(SE_a² + SE_b²); it decides when the difference is
    outside its bar, or when the bar is at most 3 points (a tie that is a result)."""
    if a["accuracy"] is None or b["accuracy"] is None:
        return None
    diff, bar = a["accuracy"] - b["accuracy"], 2 * math.hypot(a["se"], b["se"])
    return {"difference": diff, "error_bar": bar, "outside": abs(diff) > bar, "decides": abs(diff) > bar or bar <= 0.03,
            "tokens_a": a["tokens"], "tokens_b": b["tokens"]}


def paired(cells: dict[str, dict[int, dict]], a: str, b: str, mode: str, families: list[str], level: int) -> dict[str, Any] | None:
    """a − b in accuracy problem by problem: within a seed every method answers the same drawn
    problems, so the difference of the two outcomes on each problem, over the seeds both have run,
    leaves out how hard the draw was. Error bar: two standard errors of that mean difference; it
    decides by the same rule as `compare`. The bar covers which problems were drawn, not how far one
    training run of a method lies from another: `by_seed` holds each seed's own mean difference,
    whose spread shows that. None with fewer than two shared problems."""
    diffs: list[float] = []
    by_seed: dict[int, float] = {}
    seeds = sorted(set(cells.get(a, {})) & set(cells.get(b, {})))
    for seed in seeds:
        xa, xb = (_by_problem(cells[m][seed]["outcomes"][mode], families, level) for m in (a, b))
        mine = [xa[p][0] - xb[p][0] for p in sorted(xa.keys() & xb.keys())]
        if mine:
            by_seed[seed] = statistics.fmean(mine)
        diffs += mine
    if len(diffs) < 2:
        return None
    diff, bar = statistics.fmean(diffs), 2 * statistics.stdev(diffs) / math.sqrt(len(diffs))
    out = {"n": len(diffs), "seeds": seeds, "difference": diff, "error_bar": bar, "outside": abs(diff) > bar,
           "decides": abs(diff) > bar or bar <= 0.03, "by_seed": by_seed, "seeds_bar": None, "seeds_decides": False}
    if len(by_seed) >= 2:                     # the runs as the sample: Student's t over the seeds' differences
        k, values = len(by_seed), list(by_seed.values())
        seeds_bar = t_975(k - 1) * statistics.stdev(values) / math.sqrt(k)
        mean = statistics.fmean(values)
        out |= {"seeds_bar": seeds_bar, "seeds_decides": abs(mean) > seeds_bar or seeds_bar <= 0.03}
    return out


_T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
          12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t_975(df: int) -> float:
    """Student's t at 0.975 for `df` degrees of freedom (the next tabulated df below; 1.96 past 30)."""
    return _T_975[max(d for d in _T_975 if d <= df)] if df <= 30 else 1.96


def against_start(cells: dict[str, dict[int, dict]], method: str, mode: str, families: list[str],
                  levels: list[int] | list[None]) -> dict[str, Any] | None:
    """`method` against the start on the problems both answered: each of the method's seeds meets the
    start's cell of the same seed (its draw holds the seed's problems), or, where the start lacks that
    seed, whatever problems the start's first seed shares with it. Per level the mean accuracy
    difference (`levels` [None]: all levels pooled); over all levels the share of tokens saved. None
    without a shared problem."""
    start = cells.get("start", {})
    if not start or method not in cells:
        return None
    by_level: dict[int | None, list[float]] = {lv: [] for lv in levels}
    tokens = [0.0, 0.0]                                  # the method's, the start's, over the shared problems
    for seed, cell in sorted(cells[method].items()):
        reference = start.get(seed, start[min(start)])
        for lv in levels:
            xm, xs = (_by_problem(c["outcomes"][mode], families, lv, held_out=None) for c in (cell, reference))
            for p in sorted(xm.keys() & xs.keys()):
                by_level[lv].append(xm[p][0] - xs[p][0])
                tokens[0], tokens[1] = tokens[0] + xm[p][1], tokens[1] + xs[p][1]
    if not any(by_level.values()):
        return None
    differences = {lv: statistics.fmean(d) if d else None for lv, d in by_level.items()}
    return {"n": sum(map(len, by_level.values())), "accuracy_difference": differences,
            "accuracy_kept": all(d is not None and d >= 0 for d in differences.values()),
            "shorter": 1 - tokens[0] / tokens[1] if tokens[1] else None}


def _by_problem(path: Path, families: list[str], level: int | None, held_out: bool | None = False) -> dict[str, tuple[float, float]]:
    """Each problem's share of correct samples and mean length in a committed outcomes file, `families`
    at `level` (every level: None); trained problems only unless `held_out` is None."""
    by_problem: dict[str, list[tuple[bool, int]]] = {}
    with gzip.open(path, "rt") as f:
        for row in map(json.loads, filter(str.strip, f)):
            if (row.get("domain") in families and (level is None or row.get("difficulty") == level)
                    and (held_out is None or bool(row.get("held_out")) == held_out)):
                by_problem.setdefault(row["problem_id"], []).append((bool(row["correct"]), row["length"]))
    return {p: (sum(c for c, _ in v) / len(v), sum(n for _, n in v) / len(v)) for p, v in by_problem.items()}


# ---------------------------------------------------------------------------------------------
# the BENCHMARKS.md section
# ---------------------------------------------------------------------------------------------


def _seed_counts(study: Study) -> str:
    """The seeds a method runs: 3, or a range like 3–5 where some methods run more."""
    counts = sorted({len(method_seeds(study, m)) for m in study.methods})
    return "–".join(map(str, counts[:1] + counts[-1:] if len(counts) > 1 else counts))


def _f(value: float | None, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def _pct(share: float | None) -> str:
    return f"{_f(None if share is None else 100 * share, '.1f')}%"


def _over_seeds(p: dict[str, Any]) -> str:
    each = " / ".join(f"{100 * d:+.1f}" for d in p["by_seed"].values())
    if p["seeds_bar"] is None:
        return f"{each} pts | –"
    mean = statistics.fmean(p["by_seed"].values())
    decision = ("yes (apart)" if abs(mean) > p["seeds_bar"] else "yes (tie)") if p["seeds_decides"] else "no"
    return f"{each} → {100 * mean:+.1f} ± {100 * p['seeds_bar']:.1f} pts | {decision}"


def _paired_goal(trained: dict[str, Any] | None, held_out: dict[str, Any] | None) -> str:
    if trained is None:
        return "– | – | – | –"
    per_level = " / ".join("–" if d is None else f"{100 * d:+.1f}" for d in trained["accuracy_difference"].values())
    held = (f"{_pct(held_out['shorter'])} / {'yes' if held_out['accuracy_kept'] else 'no'}") if held_out else "–"
    return f"{_pct(trained['shorter'])} | {per_level} pts | {'yes' if trained['accuracy_kept'] else 'no'} ({trained['n']}) | {held}"


def _decision(c: dict[str, Any]) -> str:
    return ("yes" + (" (apart)" if c["outside"] else " (tie)")) if c["decides"] else "no"


def _levels(cells: dict[str, dict[int, dict]]) -> list[int]:
    return sorted({int(k.split("/")[1]) for by_seed in cells.values() for c in by_seed.values()
                   for r in c["evals"].values() for k in r["by_cell"]})


def study_tables(study: Study, cells: dict[str, dict[int, dict]]) -> dict[str, Any]:
    """Everything the section shows, as data (also written as study.json)."""
    levels = _levels(cells)
    hardest = max(levels) if levels else None
    methods = [m for m in ["start", *(m.name for m in study.methods)] if m in cells]
    tables: dict[str, Any] = {"levels": levels, "hardest": hardest, "methods": methods, "modes": {}}
    for mode in study.evals:
        rows: dict[str, Any] = {}
        for m in methods:
            reports = [c["evals"][mode] for c in cells[m].values()]
            rows[m] = {"seeds": sorted(cells[m]),
                       "trained": {lv: pooled(reports, study.trained, lv) for lv in levels},
                       "trained_all": pooled(reports, study.trained, None),
                       "held_out": {lv: pooled(reports, study.held_out, lv) for lv in levels} if study.held_out else {},
                       "held_out_all": pooled(reports, study.held_out, None) if study.held_out else None,
                       "by_family": {f: {lv: pooled(reports, [f], lv) for lv in levels} for f in [*study.trained, *study.held_out]},
                       "by_seed": {s: pooled([c["evals"][mode]], study.trained, None) for s, c in sorted(cells[m].items())}}
        eff = efficiency(cells, mode) if "start" in cells else {}
        for m, e in eff.items():
            rows[m]["efficiency"] = e
        pairs = []
        for gate in (g for g in study.gates if g in rows and hardest is not None):
            for p in study.penalties:
                if p in rows:
                    c = compare(rows[gate]["trained"][hardest], rows[p]["trained"][hardest])
                    if c:
                        pairs.append({"a": gate, "b": p, **c, "paired": paired(cells, gate, p, mode, study.trained, hardest)})
        goals = targets(study, rows, levels)
        for m, goal in goals.items():
            goal["paired"] = against_start(cells, m, mode, study.trained, levels)
            goal["held_out_paired"] = against_start(cells, m, mode, study.held_out, [None]) if study.held_out else None
        tables["modes"][mode] = {"rows": rows, "comparisons": pairs, "targets": goals}
    return tables


def targets(study: Study, rows: dict[str, Any], levels: list[int]) -> dict[str, Any]:
    """Per method: shorter than the start by how much, and whether its accuracy is at least the
    start's on every trained level (point estimates), and on the evaluation-only family."""
    start = rows.get("start")
    out: dict[str, Any] = {}
    if start is None:
        return out
    for m, r in rows.items():
        if m == "start":
            continue
        ok = all(r["trained"][lv]["accuracy"] is not None and start["trained"][lv]["accuracy"] is not None
                 and r["trained"][lv]["accuracy"] >= start["trained"][lv]["accuracy"] for lv in levels)
        shorter = 1 - r["trained_all"]["tokens"] / start["trained_all"]["tokens"] if r["trained_all"]["tokens"] else None
        held = r.get("held_out_all") or {}
        held_start = start.get("held_out_all") or {}
        held_shorter = (1 - held["tokens"] / held_start["tokens"]) if held.get("tokens") and held_start.get("tokens") else None
        held_ok = (held.get("accuracy") is not None and held_start.get("accuracy") is not None
                   and held["accuracy"] >= held_start["accuracy"])
        out[m] = {"shorter": shorter, "accuracy_kept": ok, "held_out_shorter": held_shorter, "held_out_accuracy_kept": held_ok}
    return out


def section(study: Study, tables: dict[str, Any], cells: dict[str, dict[int, dict]], command: str,
            figure: Path | None) -> str:
    total = len(all_cells(study))
    done = sum(len(v) for v in cells.values())
    train_minutes = [c["cell"].get("train_seconds", 0) / 60 for m, v in cells.items() if m != "start" for c in v.values()
                     if c["cell"].get("train_seconds")]
    eval_minutes = [sum(c["cell"].get("eval_seconds", {}).values()) / 60 for v in cells.values() for c in v.values()]
    lines = [f"## {study.title}" + ("" if done == total else f" — {done} of {total} cells run"), "",
             "```", command, "```", "",
             f"Recipe `recipes/bench-{study.study}.yaml`: {len(study.methods)} methods × {_seed_counts(study)} seeds from "
             f"`{study.start}`" + (f" (built by `{study.prepare}`)" if study.prepare else "") +
             f", RL on {', '.join(study.trained)}; {', '.join(study.held_out) or 'no family'} evaluated only. "
             f"Generated from the committed cells under `{study.results}/`; the numbers are measured, not edited.",
             ""]
    if train_minutes:
        lines += [f"Cell time on {study.threads} thread(s): training {min(train_minutes):.0f}–{max(train_minutes):.0f} min, "
                  f"evaluation {min(eval_minutes):.0f}–{max(eval_minutes):.0f} min.", ""]
    missing = [c.key for c in all_cells(study) if c.seed not in cells.get(c.method, {})]
    if missing:
        lines += [f"Not yet run: {', '.join(missing)}.", ""]
    levels, hardest = tables["levels"], tables["hardest"]
    if not cells:
        lines += ["No cell has run yet: no numbers.", ""]
    for mode, t in tables["modes"].items() if cells else ():
        rows = t["rows"]
        lines += [f"### {mode.capitalize()}", "",
                  "Trained families pooled, per level: accuracy ± standard error / mean tokens / oracle-redundant share of "
                  "tokens. Accuracy pools every seed's problems (a seed draws its own); overthinking (tokens over the "
                  "shortest correct response to the same problem among all methods) and underthinking (points lost on "
                  "problems the start solved) come from the seeds the start was evaluated with.", "",
                  "| method | seeds | " + " | ".join(f"level {lv}" for lv in levels) + " | all levels: tokens | redundant | "
                  "necessary tokens | tokens per correct | overthinking (O_g) | underthinking |",
                  "|---|---|" + "---|" * len(levels) + "---|---|---|---|---|---|"]
        for m, r in rows.items():
            per_level = " | ".join(f"{_f(r['trained'][lv]['accuracy'])} ± {_f(r['trained'][lv]['se'])} / "
                                   f"{_f(r['trained'][lv]['tokens'], '.0f')} / {_f(r['trained'][lv]['redundancy'])}" for lv in levels)
            a, e = r["trained_all"], r.get("efficiency", {})
            lines.append(f"| {m} | {len(r['seeds'])} | {per_level} | {_f(a['tokens'], '.0f')} | {_f(a['redundancy'])} | "
                         f"{_f(a['necessary'], '.0f')} | {_f(a['tokens_per_correct'], '.0f')} | {_f(e.get('overthinking'), '.0f')} | "
                         f"{_f(e.get('underthinking_pp'), '.1f')} pts |")
        seeds = sorted({s for r in rows.values() for s in r["by_seed"]})
        if len(seeds) > 1:
            lines += ["", "Seed by seed, trained families, all levels: accuracy / mean tokens — how far one method's seeds "
                      "lie apart, against the differences between methods", "",
                      "| method | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
            for m, r in rows.items():
                lines.append(f"| {m} | " + " | ".join(f"{_f(r['by_seed'][s]['accuracy'])} / {_f(r['by_seed'][s]['tokens'], '.0f')}"
                                                    if s in r["by_seed"] else "–" for s in seeds) + " |")
        lines += _family_lines(study, rows, levels)
        if study.held_out:
            lines += ["", f"Evaluation-only ({', '.join(study.held_out)}), per level: accuracy ± SE / tokens; and direct "
                      "answers (no thinking) on the trained families, per level", "",
                      "| method | " + " | ".join(f"held-out L{lv}" for lv in levels) + " | " +
                      " | ".join(f"direct L{lv}" for lv in levels) + " |", "|---|" + "---|" * (2 * len(levels))]
            for m, r in rows.items():
                lines.append(f"| {m} | " + " | ".join(f"{_f(r['held_out'][lv]['accuracy'])} ± {_f(r['held_out'][lv]['se'])} / "
                                                    f"{_f(r['held_out'][lv]['tokens'], '.0f')}" for lv in levels) + " | " +
                             " | ".join(_f(r["trained"][lv]["direct"]) for lv in levels) + " |")
        if t["comparisons"]:
            lines += ["", f"Each gate against each global penalty, level {hardest} (trained families): a − b in accuracy, "
                      "error bar 2·√(SE_a² + SE_b²) (the suite's rule); it decides when the difference is outside the bar or "
                      "the bar is ≤ 3 points. Paired: the same difference problem by problem on the seeds both have run (a "
                      "seed's methods answer the same problems), its bar two standard errors of the per-problem difference, "
                      "the same rule — it leaves out how hard each seed's draw was. Both bars cover which problems were "
                      "drawn, not how far one training run of a method lies from another. Over seeds: the paired "
                      "difference seed by seed, their mean ± t₀.₉₇₅·SD/√k over the k seeds (the runs as the sample), and "
                      "whether that decides by the same rule.",
                      "", "| a | b | difference | error bar | decides | paired: difference ± bar (problems) | paired decides "
                      "| over seeds: each seed → mean ± bar | over seeds decides | tokens a / b |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for c in t["comparisons"]:
                p = c.get("paired")
                lines.append(f"| {c['a']} | {c['b']} | {100 * c['difference']:+.1f} pts | {100 * c['error_bar']:.1f} pts | "
                             f"{_decision(c)} | "
                             + (f"{100 * p['difference']:+.1f} ± {100 * p['error_bar']:.1f} pts ({p['n']}) | {_decision(p)} | "
                                + _over_seeds(p) if p else "– | – | – | –") +
                             f" | {_f(c['tokens_a'], '.0f')} / {_f(c['tokens_b'], '.0f')} |")
        if t["targets"]:
            lines += ["", "Against the start: shorter by (all trained levels), accuracy at least the start's on every trained "
                      "level (point estimates), and on the evaluation-only family: shorter by, and accuracy pooled over its "
                      "levels at least the start's. Pooled: each side's own problems; paired: only the problems both "
                      "answered (a seed the start has not been evaluated on adds only the problems its draw shares with "
                      "the start's), with the accuracy difference per level.", "",
                      "| method | shorter | accuracy kept | held-out shorter | held-out accuracy kept | paired: shorter | "
                      "paired: accuracy − start per level | paired: kept (problems) | paired held-out: shorter / kept |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for m, g in t["targets"].items():
                lines.append(f"| {m} | {_pct(g['shorter'])} | {'yes' if g['accuracy_kept'] else 'no'} | "
                             f"{_pct(g['held_out_shorter'])} | {'yes' if g['held_out_accuracy_kept'] else 'no'} | "
                             + _paired_goal(g.get("paired"), g.get("held_out_paired")) + " |")
        lines.append("")
    if figure is not None:
        lines += ["**Accuracy against tokens per level, trained families pooled (± one standard error)**", "",
                  f"![{study.study} Pareto]({figure})", ""]
    lines += example_responses(study, cells)
    return "\n".join(lines)


def _family_lines(study: Study, rows: dict[str, Any], levels: list[int]) -> list[str]:
    """Each trained family on its own, per level (when there are several): a pooled level can hide
    a family where one method keeps accuracy and another loses it."""
    if len(study.trained) < 2:
        return []
    heads = [(f, lv) for f in study.trained for lv in levels]
    lines = ["", "Each trained family on its own, per level: accuracy ± SE / mean tokens", "",
             "| method | " + " | ".join(f"{f} L{lv}" for f, lv in heads) + " |", "|---|" + "---|" * len(heads)]
    for m, r in rows.items():
        cells = (r["by_family"][f][lv] for f, lv in heads)
        lines.append(f"| {m} | " + " | ".join(f"{_f(c['accuracy'])} ± {_f(c['se'])} / {_f(c['tokens'], '.0f')}" for c in cells) + " |")
    return lines


def pareto_figure(study: Study, tables: dict[str, Any], path: Path) -> Path | None:
    """One panel per level and mode: each method's accuracy against its tokens, with error bars."""
    if not tables["modes"] or not tables["levels"]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes, levels = list(tables["modes"]), tables["levels"]
    panels = [(lv, "trained") for lv in levels] + ([(None, "held_out")] if study.held_out else [])
    fig, axes = plt.subplots(len(modes), len(panels), figsize=(3.2 * len(panels), 3.0 * len(modes)), squeeze=False)
    markers = "os^vD<>ph*"
    for i, mode in enumerate(modes):
        for j, (lv, part) in enumerate(panels):
            ax = axes[i][j]
            for k, (m, r) in enumerate(tables["modes"][mode]["rows"].items()):
                p = r["held_out_all"] if part == "held_out" else r["trained"][lv]
                if p is None or p["accuracy"] is None:
                    continue
                ax.errorbar(p["tokens"], p["accuracy"], yerr=p["se"], marker=markers[k % len(markers)], capsize=2,
                            label=m, color="black" if m == "start" else None)
            ax.set_title(f"{mode}, " + ("held-out, all levels" if part == "held_out" else f"level {lv}"), fontsize=9)
            ax.set_xlabel("tokens")
            ax.set_ylabel("accuracy")
    drawn = [ax for ax in axes[0] if ax.get_legend_handles_labels()[0]]
    if drawn:
        drawn[-1].legend(fontsize=7)                # the rightmost panel with points (not an empty held-out one)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(study: Study, results: Path, benchmarks_md: Path | None, command: str, figure_dir: Path) -> dict[str, Any]:
    """The section from the committed cells: study.json beside them, the figure, BENCHMARKS.md."""
    cells = read_cells(study, Path(results))
    tables = study_tables(study, cells)
    Path(results).mkdir(parents=True, exist_ok=True)
    (Path(results) / "study.json").write_text(json.dumps(tables, indent=1, default=str))
    figure = pareto_figure(study, tables, figure_dir / f"{study.study}-pareto.png") if cells else None
    if benchmarks_md is not None:
        link = figure.resolve().relative_to(benchmarks_md.resolve().parent) if figure is not None else None
        write_section(benchmarks_md, study.study, section(study, tables, cells, command, link))
    return tables

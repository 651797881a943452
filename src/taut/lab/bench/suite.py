"""Benchmark suites: one study written as data — method families × strengths × seeds — run as
one matrix from one shared start, and reported as a section of BENCHMARKS.md.

A suite recipe is `recipes/bench-NAME.yaml` (`taut bench --suite NAME`). It is a bench recipe
(`taut.lab.bench.matrix.BenchConfig`) with three additions:

    suite: NAME                  names the BENCHMARKS.md section it writes
    title: …                     the section's heading
    prepare: …                   optional: the command that builds the suite's model
    methods:
      - name: gate-off           a family …
        seeds: [0, 1]
        strategy: {name: mastery-gated-nogate}
        sweep: {alpha: [0.25, 1.0, 4.0]}     # … one strategy parameter, weakest first
        sampler: {mastered_fraction: adaptive}   # optional: draw batches with the mixture sampler
    compare:                     optional: matched pairs, reported as differences with error bars
      - [gate-on, gate-off]      two families: paired value by value of their sweeps
      - [curriculum, curriculum (compressed)]   or two rows (a method's labelled evaluation)

A method with a `sweep` expands into one matrix method per value, named `FAMILY@PARAM=VALUE`;
a method with a `sampler` runs as one phase of `steps` steps with that sampler. Everything else
is the matrix: every method continues from one accuracy-RL start with the same rollouts.

The section reports, per method (mean over seeds): accuracy and tokens against the start, and per
level — on all domains and on the search domain alone — accuracy, tokens, necessary-step
coverage and the rate of direct answers where steps are necessary (guesses, on the search
domain), with a Pareto plot of the families' curves over their strengths.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from taut.builtin_recipes import RECIPES
from taut.config import ConfigError, read_yaml
from taut.lab.bench.matrix import (
    BenchConfig,
    load_bench,
    method_samples_path,
    run_bench,
    timing_note,
)
from taut.lab.report.figures import run_colors
from taut.models.loading import resolve_model_path
from taut.tasks.gym.domains import OPT_IN_DOMAINS, get_domain
from taut.tasks.gym.task import read_answer

SUITE_DIR = RECIPES                 # the shipped recipes (the repository's recipes/ is the same folder)
MARKERS = "osD^v<>p"        # families that coincide stay visible


@dataclass(frozen=True)
class Curve:
    family: str
    param: str | None                 # the swept strategy parameter; None: a single point
    points: tuple[tuple[str, Any], ...]   # (matrix method name, value), weakest first


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    bench: BenchConfig
    curves: tuple[Curve, ...]
    path: Path
    prepare: str | None = None      # the command that builds the model the suite starts from
    compare: tuple[tuple[str, str], ...] = ()   # (a, b): rows or families set against each other, a − b


def suite_path(name: str) -> Path:
    path = SUITE_DIR / f"bench-{name}.yaml"
    if not path.exists():
        known = sorted(p.stem.removeprefix("bench-") for p in SUITE_DIR.glob("bench-*.yaml"))
        raise ConfigError(f"no suite {name!r}: {path} does not exist (suites here: {', '.join(known) or 'none'})")
    return path


def load_suite(path: Path, quick: bool = False) -> Suite:
    """The suite recipe at `path`, its `quick:` overrides applied when `quick`, sweeps expanded."""
    path = Path(path)
    where = f"{path}{' (quick)' if quick else ''}"
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a suite recipe is a mapping with suite, title and methods")
    quick_overrides = raw.pop("quick", {}) or {}
    if quick:
        raw = {**raw, **quick_overrides}
    for key in ("suite", "title"):
        if not isinstance(raw.get(key), str):
            raise ConfigError(f"{where}: field {key!r}: expected a string, got {raw.get(key)!r}")
    name, title, prepare = raw.pop("suite"), raw.pop("title"), raw.pop("prepare", None)
    compare_pairs = raw.pop("compare", None) or []
    methods, curves = [], []
    for index, method in enumerate(raw.get("methods") or []):
        expanded, curve = _expand(method, raw.get("steps", BenchConfig.model_fields["steps"].default), f"{where}: methods[{index}]")
        methods += expanded
        curves.append(curve)
    names = [m["name"] for m in methods]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"{where}: methods: duplicate method names after expanding sweeps: {', '.join(duplicates)}")
    try:
        bench = BenchConfig.model_validate({**raw, "methods": methods})
    except ValidationError as err:
        raise ConfigError(f"{where}: {err}") from None
    known = {c.family for c in curves} | set(names)
    known |= {f"{m.name} ({label})" for m in bench.methods for label in (m.evaluate or {}) if label != "final"}
    pairs = []
    for index, pair in enumerate(compare_pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ConfigError(f"{where}: compare[{index}]: expected a pair of method or family names, got {pair!r}")
        unknown = [x for x in pair if x not in known]
        if unknown and not quick:
            raise ConfigError(f"{where}: compare[{index}]: no method or family {', '.join(map(repr, unknown))} "
                              f"(known: {', '.join(sorted(known))})")
        if not unknown:
            pairs.append((pair[0], pair[1]))
    return Suite(name, title, bench, tuple(curves), path, prepare, tuple(pairs))


def load_any_bench(path: Path, quick: bool = False) -> BenchConfig:
    """The matrix of a bench recipe or of a suite recipe (its sweeps expanded)."""
    raw = read_yaml(path)
    return load_suite(path, quick).bench if isinstance(raw, dict) and "suite" in raw else load_bench(path, quick)


def _expand(method: Any, steps: int, where: str) -> tuple[list[dict], Curve]:
    if not isinstance(method, dict) or not isinstance(method.get("name"), str):
        raise ConfigError(f"{where}: expected a mapping with a name, got {method!r}")
    method = dict(method)
    family = method["name"]
    sweep = method.pop("sweep", None)
    sampler = method.pop("sampler", None)
    strategy = method.get("strategy")
    if (sweep is not None or sampler is not None) and not isinstance(strategy, dict):
        raise ConfigError(f"{where} ({family}): a sweep or a sampler needs a strategy mapping, got strategy={strategy!r}")
    if sweep is None:
        variants, param = [(family, strategy)], None
    else:
        if not (isinstance(sweep, dict) and len(sweep) == 1 and isinstance(next(iter(sweep.values())), list)
                and next(iter(sweep.values()))):
            raise ConfigError(f"{where} ({family}): sweep: expected one strategy parameter and a non-empty list of "
                              f"values, e.g. {{alpha: [0.25, 1.0, 4.0]}}; got {sweep!r}")
        (param, values), = sweep.items()
        if param == "name":
            raise ConfigError(f"{where} ({family}): sweep: cannot sweep the strategy's name")
        variants = [(f"{family}@{param}={value}", {**strategy, param: value}) for value in values]
    out = []
    for name, strat in variants:
        entry = {**method, "name": name}
        if sampler is not None:
            entry.pop("strategy", None)
            entry["phases"] = [{"name": family, "steps": steps, "strategy": strat, "sampler": sampler}]
        elif strat is not None:
            entry["strategy"] = strat
        out.append(entry)
    points = tuple((name, None if param is None else strat[param]) for name, strat in variants)
    return out, Curve(family, param, points)


# ---------------------------------------------------------------------------------------------
# running and reporting
# ---------------------------------------------------------------------------------------------


def run_suite(suite: Suite, out: Path, benchmarks_md: Path | None, command: str) -> dict[str, Any]:
    """Run the suite's matrix (`run_bench`), then its tables, its figure and its section."""
    try:
        resolve_model_path(suite.bench.model)
    except FileNotFoundError as err:
        hint = f"; build it first: {suite.prepare}" if suite.prepare else ""
        raise ConfigError(f"{suite.path}: model: {err}{hint}") from None

    summary = run_bench(suite.bench, out, None, command)
    start_samples = Path(out) / "start-eval.samples.jsonl"
    tables = suite_tables(summary, start_samples=start_samples)
    tables["comparisons"] = comparisons(suite, tables["rows"])
    tables["start_redundancy"] = {"default": start_redundancy(start_samples, exclude=set(OPT_IN_DOMAINS)),
                                  "all": start_redundancy(start_samples)}
    tables["start"]["default_accuracy"] = _domain_mean(summary["start"], set(summary["start"]["by_domain"]) - set(OPT_IN_DOMAINS),
                                                       "accuracy")
    (Path(out) / "suite.json").write_text(json.dumps({"suite": suite.name, **tables}, indent=1))
    figure_dir = (benchmarks_md.parent / "docs" / "figures") if benchmarks_md is not None else Path(out)
    figure = pareto_curves(suite, tables["rows"], tables["start"], figure_dir / f"{suite.name}-pareto.png")
    bars = level_bars(suite, tables["rows"], tables["start"], figure_dir / f"{suite.name}-search-levels.png")
    if benchmarks_md is not None:
        links = [f.relative_to(benchmarks_md.parent) if f is not None else None for f in (figure, bars)]
        write_section(benchmarks_md, suite.name, results_section(suite, summary, tables, *links))
    return {**summary, "suite": tables}


def _necessary(domain: str, level: int) -> bool:
    return level not in get_domain(domain).direct_levels


def level_stats(evaluation: dict, domains: set[str] | None = None) -> dict[str, dict[str, float | None]]:
    """Per level, from an evaluation's domain × level cells (optionally only some domains):
    accuracy, tokens, necessary-step coverage, and the rate of direct answers (no step written)
    on cells whose steps are necessary."""
    by_level: dict[str, list[tuple[str, dict]]] = {}
    for cell, s in evaluation["by_cell"].items():
        domain, _, level = cell.rpartition("/")
        if (domains is None or domain in domains) and s.get("n_samples"):
            by_level.setdefault(level, []).append((domain, s))
    out = {}
    for level, cells in sorted(by_level.items(), key=lambda kv: int(kv[0])):
        def weighted(key, keep=lambda d: True, cells=cells):
            pairs = [(s["n_samples"], s[key]) for d, s in cells if keep(d) and s.get(key) is not None]
            total = sum(n for n, _ in pairs)
            return sum(n * v for n, v in pairs) / total if total else None
        thinks = weighted("thinks_rate", lambda d, level=level: _necessary(d, int(level)))
        out[level] = {"accuracy": weighted("accuracy"), "tokens": weighted("tokens_mean"), "coverage": weighted("coverage"),
                      "direct_where_necessary": None if thinks is None else 1 - thinks,
                      "samples": sum(s["n_samples"] for _, s in cells)}
    return out


def _mean(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def guess_stats(samples_path: Path, domains: set[str]) -> dict[str, float | None]:
    """From an evaluation's samples on the given (search) domains: the share of responses that
    answer without writing a step (guesses), and the accuracy of those guesses — against chance,
    1/10 for a random digit and 1/2 for a pick between the two digits the target allows."""
    if not samples_path.exists():
        return {"guess_rate": None, "guess_accuracy": None}
    samples = [json.loads(line) for line in samples_path.read_text().splitlines() if line.strip()]
    ours = [s for s in samples if s["domain"] in domains and s["thinks"] is not None]
    guesses = [s for s in ours if not s["thinks"]]
    return {"guess_rate": len(guesses) / len(ours) if ours else None,
            "guess_accuracy": statistics.fmean(s["correct"] for s in guesses) if guesses else None}


def suite_tables(summary: dict[str, Any], start_samples: Path | None = None) -> dict[str, Any]:
    """One row per matrix method (mean over seeds) and the start's row, with per-level stats."""
    search = set(OPT_IN_DOMAINS)

    def row_of(evals: list[dict], samples: list[Path | None]) -> dict[str, Any]:
        guesses = [guess_stats(p, search) for p in samples if p is not None]
        per_seed = {
            "accuracy": [e["overall"]["accuracy"] for e in evals],
            "tokens": [e["overall"]["tokens_mean"] for e in evals],
            "search_accuracy": [_domain_mean(e, search, "accuracy") for e in evals],
            "search_tokens": [_domain_mean(e, search, "tokens_mean") for e in evals],
        }
        row: dict[str, Any] = {key: _mean(values) for key, values in per_seed.items()}
        row |= {
            "search_guess_rate": _mean([g["guess_rate"] for g in guesses]),
            "search_guess_accuracy": _mean([g["guess_accuracy"] for g in guesses]),
            "seed_values": per_seed,
            # binomial standard error of the seeds' mean accuracy: √(p(1 − p) / n) per evaluation, over √seeds
            "accuracy_se": _mean_se([(e["overall"]["accuracy"], e["overall"]["n_samples"]) for e in evals]),
            "search_accuracy_se": _mean_se([(_domain_mean(e, search, "accuracy"), _domain_samples(e, search)) for e in evals]),
        }
        for key, domains in (("levels", None), ("search_levels", search)):
            per = [level_stats(e, domains) for e in evals]
            levels = sorted({lv for p in per for lv in p}, key=int)
            row[key] = {lv: {k: _mean([p[lv][k] for p in per if lv in p]) for k in ("accuracy", "tokens", "coverage", "direct_where_necessary")}
                        for lv in levels}
        return row

    start = row_of([summary["start"]], [start_samples])
    groups: dict[str, list[tuple[dict, Path | None]]] = {}
    for r in summary["results"].values():
        for label, e in r["evals"].items():
            name = r["method"] if label == "final" else f"{r['method']} ({label})"
            path = method_samples_path(r, e) if "run_dir" in r and "checkpoint" in e else None
            groups.setdefault(name, []).append((e, path))
    rows = []
    for name, pairs in groups.items():
        row = {"method": name, "seeds": len(pairs), **row_of([e for e, _ in pairs], [p for _, p in pairs])}
        row["length_change"] = row["tokens"] / start["tokens"] - 1
        row["accuracy_change"] = row["accuracy"] - start["accuracy"]
        rows.append(row)
    return {"start": start, "rows": rows}


def _mean_se(pairs: list[tuple[float | None, int]]) -> float | None:
    """Standard error of the mean of independent accuracies, each p over n samples."""
    pairs = [(p, n) for p, n in pairs if p is not None and n]
    if not pairs:
        return None
    return math.sqrt(sum(p * (1 - p) / n for p, n in pairs)) / len(pairs)


def _domain_samples(evaluation: dict, domains: set[str]) -> int:
    return sum(s.get("n_samples", 0) for d, s in evaluation["by_domain"].items() if d in domains)


def compare(rows: list[dict], a: str, b: str, metric: str) -> dict[str, Any] | None:
    """Row a against row b on an accuracy metric: the difference of the seed means, its error bar
    2·√(SE_a² + SE_b²) from the evaluations' standard errors, and whether the difference counts:
    larger than that bar and every seed of one row on the same side of every seed of the other."""
    by_name = {r["method"]: r for r in rows}
    if a not in by_name or b not in by_name or by_name[a].get(metric) is None or by_name[b].get(metric) is None:
        return None
    ra, rb = by_name[a], by_name[b]
    diff = ra[metric] - rb[metric]
    se_a, se_b = ra.get(f"{metric}_se"), rb.get(f"{metric}_se")
    bar = 2 * math.sqrt(se_a**2 + se_b**2) if se_a is not None and se_b is not None else None
    va = [v for v in ra["seed_values"][metric] if v is not None]
    vb = [v for v in rb["seed_values"][metric] if v is not None]
    separated = bool(va and vb and (min(va) > max(vb) or max(va) < min(vb)))
    return {"a": a, "b": b, "metric": metric, "difference": diff, "error_bar": bar,
            "seeds_separated": separated, "counts": bar is not None and abs(diff) > bar and separated}


def comparisons(suite: "Suite", rows: list[dict]) -> list[dict[str, Any]]:
    """The suite's `compare` pairs, family pairs expanded value by value (gate-on@alpha=1.0 against
    gate-off@alpha=1.0), on accuracy and search accuracy, with tokens alongside."""
    curves = {c.family: c for c in suite.curves}
    pairs: list[tuple[str, str]] = []
    for a, b in suite.compare:
        if a in curves and b in curves and curves[a].param:
            values_b = {v: n for n, v in curves[b].points}
            pairs += [(n, values_b[v]) for n, v in curves[a].points if v in values_b]
        else:
            pairs.append((a, b))
    by_name = {r["method"]: r for r in rows}
    out = []
    for a, b in pairs:
        for metric in ("accuracy", "search_accuracy"):
            c = compare(rows, a, b, metric)
            if c is not None:
                tokens = "tokens" if metric == "accuracy" else "search_tokens"
                c["tokens_a"], c["tokens_b"] = by_name[a][tokens], by_name[b][tokens]
                out.append(c)
    return out


def start_redundancy(samples_path: Path, exclude: set[str] = frozenset()) -> dict[str, dict[str, float]]:
    """The start's redundant tokens by kind and level, from its evaluation samples on the testbed:
    thinking beyond the necessary steps, and rounds written after the graded answer (shares of all
    response tokens), and the share of responses that answer without a step."""
    if not samples_path.exists():
        return {}
    cells: dict[str, dict[str, float]] = {}
    for line in samples_path.read_text().splitlines():
        if not line.strip():
            continue
        s = json.loads(line)
        if s.get("redundant_tokens") is None or s["domain"] in exclude:
            continue
        words = s["text"].split()
        answer, end = read_answer(words, not s["truncated"])
        post = len(words) - end if answer is not None else 0
        for key in (str(s["difficulty"]), "all"):
            c = cells.setdefault(key, {"tokens": 0, "redundant": 0, "rounds": 0, "responses": 0, "direct": 0})
            c["tokens"] += s["length"]
            c["redundant"] += s["redundant_tokens"]
            c["rounds"] += post
            c["responses"] += 1
            c["direct"] += not s["thinks"]
    return {key: {"redundancy": c["redundant"] / c["tokens"], "extra_thinking": (c["redundant"] - c["rounds"]) / c["tokens"],
                  "rounds": c["rounds"] / c["tokens"], "direct": c["direct"] / c["responses"]}
            for key, c in sorted(cells.items(), key=lambda kv: (kv[0] == "all", kv[0]))}


def _domain_mean(evaluation: dict, domains: set[str], key: str) -> float | None:
    cells = [s for d, s in evaluation["by_domain"].items() if d in domains and s.get("n_samples")]
    total = sum(s["n_samples"] for s in cells)
    return sum(s["n_samples"] * s[key] for s in cells) / total if total else None


def pareto_curves(suite: Suite, rows: list[dict], start: dict, path: Path) -> Path | None:
    """Accuracy against tokens: each family a curve over its strengths (mean over seeds)."""
    from matplotlib.figure import Figure

    by_name = {r["method"]: r for r in rows}
    curves = [c for c in suite.curves if any(name in by_name for name, _ in c.points)]
    if not curves:
        return None
    fig = Figure(figsize=(7.5, 5.0), layout="constrained")
    panels = (("accuracy", "tokens", "all domains"), ("search_accuracy", "search_tokens", "search domain"))
    axes = fig.subplots(1, 2)
    for ax, (acc, tok, title) in zip(axes, panels):
        for i, (curve, color) in enumerate(zip(curves, run_colors(len(curves)))):
            pts = [(by_name[n][tok], by_name[n][acc], v) for n, v in curve.points if n in by_name and by_name[n][acc] is not None]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", marker=MARKERS[i % len(MARKERS)], color=color,
                    label=curve.family, markersize=5, fillstyle="none" if i % 2 else "full")
            for x, y, v in pts:
                if v is not None:
                    ax.annotate(f"{v:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6, color=color)
        if start.get(acc) is not None:
            ax.plot([start[tok]], [start[acc]], "k*", markersize=10, label="start")
        ax.set_xlabel("mean tokens")
        ax.set_ylabel("accuracy")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    return path


def level_bars(suite: Suite, rows: list[dict], start: dict, path: Path) -> Path | None:
    """The search domain per level, accuracy and tokens as grouped bars: the start, the single-point
    families (the control), and every strength of the families the suite compares pairwise
    (gate on and gate off), mean over seeds."""
    from matplotlib.figure import Figure

    by_name = {r["method"]: r for r in rows}
    curves = {c.family: c for c in suite.curves}
    paired = [(a, b) for a, b in suite.compare if a in curves and b in curves and curves[a].param]
    control = [c.points[0][0] for c in suite.curves if c.param is None and c.family not in {f for pair in paired for f in pair}]
    shown = control[:1] + [name for pair in paired for family in pair for name, _ in curves[family].points]
    hatched = {name for _, b in paired for name, _ in curves[b].points}          # the b side of each pair
    picks = [("start", start)] + [(name, by_name[name]) for name in dict.fromkeys(shown) if name in by_name]
    levels = sorted({lv for _, r in picks for lv in r.get("search_levels", {})}, key=int)
    if not levels or len(picks) < 2:
        return None
    fig = Figure(figsize=(8.0, 5.6), layout="constrained")
    axes = fig.subplots(2, 1, sharex=True)
    width = 0.8 / len(picks)
    colors = ["0.4"] + run_colors(len(picks) - 1)
    for ax, key, label in ((axes[0], "accuracy", "accuracy"), (axes[1], "tokens", "mean tokens")):
        for i, ((name, row), color) in enumerate(zip(picks, colors)):
            values = [row["search_levels"].get(lv, {}).get(key) for lv in levels]
            xs = [j + (i - (len(picks) - 1) / 2) * width for j in range(len(levels))]
            ax.bar([x for x, v in zip(xs, values) if v is not None], [v for v in values if v is not None], width,
                   color=color, label=name, hatch="//" if name in hatched else None, edgecolor="white", linewidth=0.3)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_xticks(range(len(levels)), [f"level {lv}" for lv in levels])
    axes[0].set_title("search domain, per level", fontsize=9)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4, fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    return path


# ---------------------------------------------------------------------------------------------
# the BENCHMARKS.md section
# ---------------------------------------------------------------------------------------------


def section_markers(name: str) -> tuple[str, str]:
    return f"<!-- suite:{name} -->", f"<!-- /suite:{name} -->"


def write_section(path: Path, name: str, text: str) -> None:
    """Put `text` between the suite's markers in `path`: replace the old block or append one."""
    path = Path(path)
    start, end = section_markers(name)
    block = f"{start}\n{text.strip()}\n{end}"
    current = path.read_text() if path.exists() else ""
    if start in current and end in current:
        head, rest = current.split(start, 1)
        tail = rest.split(end, 1)[1]
        path.write_text(head + block + tail)
    else:
        path.write_text(current.rstrip("\n") + ("\n\n" if current else "") + block + "\n")


def design_lines(suite: Suite) -> list[str]:
    """The study as run: methods × strengths × seeds, and the shared settings."""
    bench = suite.bench
    seeds = {m.name: m.seeds for m in bench.methods}
    runs = sum(len(s) for s in seeds.values())
    lines = [
        f"Recipe `recipes/{suite.path.name}`, starting from `{bench.model}`" + (f", built by `{suite.prepare}`." if suite.prepare else "."),
        f"{bench.start_steps} accuracy-RL steps make the shared start; then {bench.steps} RL steps per method of "
        f"{bench.rl.prompts_per_step} prompts × {bench.rl.group_size} rollouts",
        f"(dynamic sampling {'on' if bench.rl.dynamic_sampling else 'off'}), training on {', '.join(map(str, bench.train))}; "
        f"evaluated on the test split of {', '.join(map(str, bench.eval.tasks or ['gym:all']))},",
        f"{bench.eval.n_per_level} problems per domain and level, {bench.eval.samples} sample(s) each. {runs} training runs.",
        "",
        "| family | swept | values (weakest first) | seeds |",
        "|---|---|---|---|",
    ]
    for c in suite.curves:
        values = ", ".join(f"{v:g}" if isinstance(v, (int, float)) else str(v) for _, v in c.points) if c.param else "–"
        lines.append(f"| {c.family} | {c.param or '–'} | {values} | {', '.join(map(str, seeds[c.points[0][0]]))} |")
    return lines


def plan_section(suite: Suite, command: str) -> str:
    """The section before the study has run: the design and the command, marked not yet run."""
    return "\n".join([
        f"## {suite.title} — not yet run",
        "",
        "```",
        command,
        "```",
        "",
        *design_lines(suite),
        "",
        "No numbers yet: this section is replaced by the measured tables and the Pareto plot when the",
        "command above runs.",
    ])


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _level_cell(s: dict) -> str:
    return f"{_f(s['accuracy'])} / {_f(s['tokens'], 1)} / {_f(s['coverage'])} / {_f(s['direct_where_necessary'])}"


def _pts(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} pts"


def _seeds(values: list[float | None], digits: int = 3) -> str:
    return ", ".join(_f(v, digits) for v in values)


def results_section(suite: Suite, summary: dict[str, Any], tables: dict[str, Any], figure: Path | None,
                    bars: Path | None = None) -> str:
    start, rows = tables["start"], sorted(tables["rows"], key=lambda r: r["method"])
    took = f"Ran in {summary['seconds'] / 60:.1f} minutes on this machine{timing_note(summary)}"
    lines = [
        f"## {suite.title}",
        "",
        "```",
        summary["command"],
        "```",
        "",
        f"{took}. Generated; the numbers are measured, not edited.",
        "",
        *design_lines(suite),
        "",
        f"**Start**: accuracy {start['accuracy']:.3f} (the seven default domains: {_f(start.get('default_accuracy'), 3)}), "
        f"{start['tokens']:.1f} tokens; search domain "
        f"{_f(start['search_accuracy'], 3)} / {_f(start['search_tokens'], 1)} tokens, guesses {_f(start['search_guess_rate'])} "
        f"of its answers, right {_f(start['search_guess_accuracy'])} of the time.",
    ]
    redundancy = tables.get("start_redundancy") or {}
    for key, title in (("default", "the seven default domains"), ("all", "all domains, search included")):
        cells = redundancy.get(key) or {}
        if cells:
            lines += ["", f"Start, {title}: redundant tokens by kind (shares of all response tokens) and direct answers",
                      "", "| level | redundant | thinking beyond the necessary steps | rounds after the answer | responses without a step |",
                      "|---|---|---|---|---|"]
            for level, c in cells.items():
                lines.append(f"| {level} | {100 * c['redundancy']:.1f}% | {100 * c['extra_thinking']:.1f}% | {100 * c['rounds']:.1f}% | "
                             f"{100 * c['direct']:.1f}% |")
    lines += [
        "",
        "Accuracy is the mean over seeds ± the binomial standard error of that mean (√(p(1 − p)/n) per evaluation);",
        "the seeds' own values follow. Search guesses: the share of search answers written without a step, and their",
        "accuracy (chance: 0.10 for a random digit, 0.50 for a pick between the two digits the target allows).",
        "",
        "| method | seeds | accuracy | per seed | tokens | length change | accuracy change | search accuracy | per seed | search tokens | search guesses | guesses right |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sv = r.get("seed_values", {})
        lines.append(f"| {r['method']} | {r['seeds']} | {r['accuracy']:.3f} ± {_f(r.get('accuracy_se'), 3)} | "
                     f"{_seeds(sv.get('accuracy', []))} | {r['tokens']:.1f} | {100 * r['length_change']:+.1f}% | "
                     f"{100 * r['accuracy_change']:+.1f} pts | {_f(r['search_accuracy'], 3)} ± {_f(r.get('search_accuracy_se'), 3)} | "
                     f"{_seeds(sv.get('search_accuracy', []))} | {_f(r['search_tokens'], 1)} | "
                     f"{_f(r['search_guess_rate'])} | {_f(r['search_guess_accuracy'])} |")
    pairs = tables.get("comparisons") or []
    if pairs:
        lines += ["", "**Matched comparisons** (a − b). A difference counts when it is larger than its error bar,",
                  "2·√(SE_a² + SE_b²), and every seed of one side lies beyond every seed of the other.", "",
                  "| a | b | on | difference | error bar | seeds apart | counts | tokens a / b |", "|---|---|---|---|---|---|---|---|"]
        for c in pairs:
            lines.append(f"| {c['a']} | {c['b']} | {c['metric'].replace('_', ' ')} | {100 * c['difference']:+.1f} pts | "
                         f"{_pts(c['error_bar'])} | "
                         f"{'yes' if c['seeds_separated'] else 'no'} | {'**yes**' if c['counts'] else 'no'} | "
                         f"{_f(c['tokens_a'], 1)} / {_f(c['tokens_b'], 1)} |")
    for key, title in (("levels", "all domains"), ("search_levels", "search domain")):
        levels = sorted({lv for r in [start, *rows] for lv in r[key]}, key=int)
        lines += ["", f"Per level, {title}: accuracy / tokens / necessary-step coverage / direct answers where steps are necessary",
                  "", "| method | " + " | ".join(f"level {lv}" for lv in levels) + " |", "|---|" + "---|" * len(levels)]
        for r in [{"method": "start", **start}, *rows]:
            lines.append(f"| {r['method']} | " + " | ".join(_level_cell(r[key][lv]) if lv in r[key] else "–" for lv in levels) + " |")
    if figure is not None:
        lines += ["", "**Accuracy against tokens, each family over its strengths**", "", f"![{suite.name} Pareto curves]({figure})"]
    if bars is not None:
        lines += ["", "**The search domain per level**: the start, the control and every strength of the families compared "
                  "pairwise above", "", f"![{suite.name} search domain per level]({bars})"]
    return "\n".join(lines)

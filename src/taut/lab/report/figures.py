"""The report's figures. Each function draws one figure and returns it with the exact data it
plotted, so the data can be written next to the images and checked against its sources.

Figures are `matplotlib.figure.Figure` objects rendered by the Agg canvas: no pyplot, no global
backend state, safe to call from any process. A run keeps its colour in every figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import matplotlib
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullLocator

from taut.lab.report.frontier import pareto_frontier
from taut.lab.report.runs import RunResults, change_pct, value

# Okabe–Ito, colour-blind safe, without its yellow (unreadable on white); tab10 after that.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8C564B"]
CORRECT, WRONG = "#2A9D8F", "#E76F51"
GREY = "#555555"

STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#E4E4E4",
    "grid.linewidth": 0.8,
    "axes.axisbelow": True,
    "legend.frameon": False,
    "legend.fontsize": 9,
    "figure.dpi": 100,
}

# training-log panels: (metrics key, title, axis label, validation key)
TRAINING_PANELS = [
    ("length_mean", "Response length", "mean tokens per response", "val_tokens_mean"),
    ("accuracy", "Accuracy", "accuracy on the step's rollouts", "val_accuracy"),
    ("cap", "Length cap L(t)", "rollout cap (tokens)", None),
    ("truncation_rate", "Truncation rate", "share of rollouts hitting the cap", None),
    ("entropy", "Policy entropy", "nats per response token", None),
    ("grad_norm", "Gradient norm", "L2 norm before clipping", None),
]
# short axis labels (the panels are stacked two by two): what the share is of goes in the title
STRATEGY_PANELS = [
    ("mastered_frac", "Mastered prompts, share of the pool", "share"),
    ("gate_open", "Gate open, share of groups let in", "share"),
    ("penalised_frac", "Penalised rollouts, share", "share"),
    ("penalty_mean", "Mean penalty per penalised rollout", "reward"),
    ("safe_len_mean", "Safe length", "tokens"),
    ("kept_frac", "Kept for on-policy SFT, share", "share"),
]
NEEDS_TWO = ("every run has a single evaluated checkpoint; evaluate its first one too, e.g. "
             "`taut eval RUN/checkpoints/step-000000 --out RUN/eval/step-000000.json`.")
FRACTION_KEYS = {"accuracy", "val_accuracy", "truncation_rate", "mastered_frac", "gate_open", "penalised_frac", "kept_frac"}


@dataclass
class Drawn:
    """A finished figure and the numbers it shows."""

    name: str
    title: str
    caption: str
    figure: Figure
    data: dict[str, Any]


@dataclass
class Omitted:
    """A figure the runs have no data for, and what would provide it."""

    name: str
    title: str
    reason: str


EXTRA = ["#D62728", "#9467BD", "#BCBD22", "#7F7F7F", "#17BECF"]   # distinct from PALETTE's hues


def run_colors(n: int) -> list[str]:
    palette = PALETTE + EXTRA
    return [palette[i % len(palette)] for i in range(n)]


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _percent_axis(axis) -> None:
    """Fractions shown as percentages with no more decimals than the ticks need (2.5%, 10%)."""
    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{round(100 * x, 6):g}%"))


def _fraction_limits(ax) -> None:
    """Keep a fraction axis inside [0, 1] (plus a little room for markers) and its ticks on real values."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(max(lo, -0.03), min(hi, 1.03))
    ax.set_yticks([t for t in ax.get_yticks() if -1e-9 <= t <= 1 + 1e-9])


def _nan_to_none(values: list[float]) -> list[float | None]:
    return [None if isinstance(v, float) and math.isnan(v) else v for v in values]


# ---------------------------------------------------------------------------------------------
# 1. accuracy vs mean tokens, with the Pareto frontier
# ---------------------------------------------------------------------------------------------


def accuracy_vs_tokens(runs: list[RunResults], colors: list[str]) -> Drawn:
    fig = _figure(9.0, 5.4)
    ax = fig.add_subplot()
    points, owners, data_runs = [], [], []
    notes: dict[tuple[float, float], dict[int, set[str]]] = {}   # place → step → colours: one label per place
    for run, color in zip(runs, colors):
        tokens = [value(e.result["overall"], "tokens_mean") for e in run.evaluations]
        accuracy = [value(e.result["overall"], "accuracy") for e in run.evaluations]
        ax.plot(tokens, accuracy, "-o", color=color, lw=1.8, ms=4.5, alpha=0.9, zorder=3)
        first, chosen = run.evaluations.index(run.first), run.evaluations.index(run.chosen)
        ax.plot(tokens[first], accuracy[first], "o", ms=10, mfc="white", mec=color, mew=2, zorder=4)
        ax.plot(tokens[chosen], accuracy[chosen], "*", ms=16, color=color, mec="white", mew=0.8, zorder=5)
        labelled = range(len(tokens)) if len(runs) == 1 else sorted({first, chosen})   # one run: every step
        for index in labelled:
            place = notes.setdefault((tokens[index], accuracy[index]), {})
            place.setdefault(run.evaluations[index].step, set()).add(color)
        for e, t, a in zip(run.evaluations, tokens, accuracy):
            points.append((t, a))
            owners.append((run.label, e.checkpoint))
        data_runs.append({"label": run.label, "checkpoints": [e.checkpoint for e in run.evaluations],
                          "steps": [e.step for e in run.evaluations], "tokens_mean": _nan_to_none(tokens),
                          "accuracy": _nan_to_none(accuracy), "first": run.first.checkpoint, "chosen": run.chosen.checkpoint})
    for (x, y), steps in notes.items():
        if not (math.isnan(x) or math.isnan(y)):
            text = ("step " if len(steps) == 1 else "steps ") + ", ".join(str(s) for s in sorted(steps))
            owners_colors = set().union(*steps.values())
            ax.annotate(text, (x, y), xytext=(7, 5), textcoords="offset points", fontsize=8, zorder=6,
                        color=owners_colors.pop() if len(owners_colors) == 1 else GREY,
                        bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.75})
    frontier = pareto_frontier(points)
    fx, fy = [points[i][0] for i in frontier], [points[i][1] for i in frontier]
    if frontier:
        ax.step(fx, fy, where="post", ls="--", lw=1.3, color=GREY, zorder=2)
        ax.plot(fx, fy, "o", ms=13, mfc="none", mec=GREY, mew=1.0, alpha=0.6, zorder=2)
    ax.margins(x=0.08, y=0.1)
    _percent_axis(ax.yaxis)
    _fraction_limits(ax)
    ax.set_xlabel("mean response length (tokens)")
    ax.set_ylabel("accuracy")
    handles = [Line2D([], [], color=c, lw=1.8, marker="o", ms=4.5, label=r.label) for r, c in zip(runs, colors)]
    handles += [
        Line2D([], [], ls="--", color=GREY, lw=1.3, marker="o", ms=9, mfc="none", mec=GREY, label="Pareto frontier"),
        Line2D([], [], ls="", marker="o", ms=8, mfc="white", mec=GREY, mew=1.8, label="first evaluated checkpoint"),
        Line2D([], [], ls="", marker="*", ms=12, color=GREY, label="chosen checkpoint"),
    ]
    _legend_beside(ax, handles)
    return Drawn(
        "accuracy_vs_tokens", "Accuracy vs. tokens",
        "Every evaluated checkpoint of every run, joined in step order (ring: the first evaluated checkpoint; "
        "star: the chosen one). The dashed staircase is the Pareto frontier: no other point has higher accuracy "
        "with fewer tokens. A method that compresses well moves left without moving down.",
        fig,
        {"runs": data_runs, "frontier": [{"label": owners[i][0], "checkpoint": owners[i][1], "tokens_mean": points[i][0],
                                          "accuracy": points[i][1]} for i in frontier]},
    )


def _legend_beside(ax, handles: list) -> None:
    """The legend to the right of the axes, top-aligned (the run figures' legends)."""
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


# ---------------------------------------------------------------------------------------------
# 2. accuracy under a token budget
# ---------------------------------------------------------------------------------------------


def budget_accuracy(runs: list[RunResults], colors: list[str]) -> Drawn:
    fig = _figure(9.0, 4.6)
    ax = fig.add_subplot()
    data_runs, all_budgets = [], set()
    for run, color in zip(runs, colors):
        table = run.chosen.result["overall"]["budget_accuracy"]
        budgets = sorted(int(b) for b in table)
        accuracy = [math.nan if table[str(b)] is None else table[str(b)] for b in budgets]
        full = value(run.chosen.result["overall"], "accuracy")
        ax.plot(budgets, accuracy, "-o", color=color, lw=1.8, ms=5, zorder=3)
        ax.axhline(full, color=color, lw=1.0, ls=":", alpha=0.9, zorder=2)
        all_budgets.update(budgets)
        data_runs.append({"label": run.label, "checkpoint": run.chosen.checkpoint, "budgets": budgets,
                          "accuracy": _nan_to_none(accuracy), "accuracy_unbudgeted": None if math.isnan(full) else full})
    caps = {run.chosen.result.get("max_new_tokens") for run in runs}
    cap = caps.pop() if len(caps) == 1 else None
    if cap is not None and all_budgets and min(all_budgets) < cap < max(all_budgets):
        ax.axvline(cap, color=GREY, lw=1.0, ls="--", zorder=1)
        ax.annotate(f"generation cap {cap}", (cap, 1), xycoords=("data", "axes fraction"), xytext=(-4, -4),
                    textcoords="offset points", ha="right", va="top", fontsize=8, color=GREY)
    if all_budgets:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sorted(all_budgets)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
    _percent_axis(ax.yaxis)
    highest = max([v for r in data_runs for v in r["accuracy"] + [r["accuracy_unbudgeted"]] if v is not None] + [0.0])
    ax.set_ylim(0, max(highest, 0.05) * 1.08)
    _fraction_limits(ax)
    ax.set_xlabel("token budget B (tokens, log scale)")
    ax.set_ylabel("accuracy within B tokens")
    handles = [Line2D([], [], color=c, lw=1.8, marker="o", ms=5, label=f"{r.label} ({r.chosen.checkpoint})")
               for r, c in zip(runs, colors)]
    handles.append(Line2D([], [], color=GREY, lw=1.0, ls=":", label="accuracy without a budget"))
    _legend_beside(ax, handles)
    return Drawn(
        "budget_accuracy", "Accuracy under a token budget",
        "A response cut at B tokens counts only if its answer was already complete and correct within those B "
        "tokens. The dotted line is the run's accuracy without a budget; the budget at which a curve reaches it "
        "is the length the run really needs.",
        fig, {"runs": data_runs},
    )


# ---------------------------------------------------------------------------------------------
# 3. training dynamics
# ---------------------------------------------------------------------------------------------


def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of every record that logged `key` with a value, in step order."""
    pairs = sorted((r["step"], float(r[key])) for r in records if r.get(key) is not None and "step" in r)
    return [s for s, _ in pairs], [v for _, v in pairs]


def moving_average(values: list[float], window: int) -> list[float]:
    """Centred moving average over up to `window` neighbours (shorter at the ends)."""
    half = window // 2
    out = []
    for i in range(len(values)):
        near = values[max(0, i - half):i + half + 1]
        out.append(sum(near) / len(near))
    return out


def phase_spans(records: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """Contiguous runs of one `phase` value over the training steps, as (name, first step − 0.5,
    last step + 0.5). Event records (phase start, early stop) mark moments, not steps: skipped."""
    steps = sorted((r["step"], r["phase"]) for r in records
                   if r.get("phase") is not None and "step" in r and "event" not in r)
    spans: list[tuple[str, float, float]] = []
    for step, name in steps:
        if spans and spans[-1][0] == name:
            spans[-1] = (name, spans[-1][1], step + 0.5)
        else:
            spans.append((name, step - 0.5, step + 0.5))
    return spans


def fixed_cap(runs: list[RunResults]) -> float | None:
    """The rollout cap when every run logged the same one at every step (a flat L(t) panel says
    nothing a sentence cannot); None when it moves or differs between runs."""
    caps = {v for r in runs for v in series(r.metrics, "cap")[1]}
    return caps.pop() if len(caps) == 1 else None


def training_dynamics(runs: list[RunResults], colors: list[str]) -> Drawn | Omitted:
    if not any(series(r.metrics, key)[0] for r in runs for key, *_ in TRAINING_PANELS):
        return Omitted("training_dynamics", "Training dynamics", "no run has a training log (RUN/metrics.jsonl).")
    cap = fixed_cap(runs)
    panels = [p for p in TRAINING_PANELS if not (p[0] == "cap" and cap is not None)]
    fig, data = _step_panels(runs, colors, panels)
    data["fixed_cap"] = cap
    return Drawn(
        "training_dynamics", "Training dynamics",
        "The per-step training log (metrics.jsonl). Length and accuracy are measured on each step's own rollouts; "
        "validation points, where logged, on problems held back from training. Shaded bands (or dashed lines "
        "in the run's colour) mark curriculum phases."
        + (f" The rollout cap L(t) stayed at {cap:g} tokens throughout (not drawn)." if cap is not None else ""),
        fig, data,
    )


def strategy_signals(runs: list[RunResults], colors: list[str]) -> Drawn | Omitted:
    """The length strategies' own metrics, for the runs that logged them."""
    panels = [(*p, None) for p in STRATEGY_PANELS if any(series(r.metrics, p[0])[0] for r in runs)]
    if not panels:
        return Omitted("strategy_signals", "Length-strategy signals",
                       f"no run logged any of {', '.join(p[0] for p in STRATEGY_PANELS)}.")
    keys = [p[0] for p in panels]
    chosen = [(r, c) for r, c in zip(runs, colors) if any(series(r.metrics, k)[0] for k in keys)]
    fig, data = _step_panels([r for r, _ in chosen], [c for _, c in chosen], panels)
    return Drawn(
        "strategy_signals", "Length-strategy signals",
        "What the length strategies saw and did at each step: the share of the prompt pool mastered, the share "
        "of groups a gate let in, the share of rollouts penalised and the mean penalty, the safe length. Only "
        "runs that log these appear.",
        fig, data,
    )


def _step_panels(runs: list[RunResults], colors: list[str], panels) -> tuple[Figure, dict[str, Any]]:
    """A grid of per-step curves, one panel per metric, one colour per run."""
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig = _figure(11.0, 2.6 * rows + 0.7)
    axes = fig.subplots(rows, cols, sharex=True, squeeze=False).ravel()
    # a single phase has nothing to mark: phases show only where a run changes phase
    spans = {run.label: s if len(s := phase_spans(run.metrics)) > 1 else [] for run in runs}
    first_spans = next(iter(spans.values()))
    shared = first_spans if first_spans and all(s == first_spans for s in spans.values()) else None
    stops = {run.label: [r for r in run.metrics if r.get("event") == "early-stop"] for run in runs}
    data: dict[str, Any] = {"runs": [], "phases": {k: [list(s) for s in v] for k, v in spans.items()},
                            "early_stops": {k: [{"step": r["step"], "detector": r.get("detector"),
                                                 "rolled_back_to": r.get("rolled_back_to")} for r in v]
                                            for k, v in stops.items()}}
    windows = {run.label: max(1, round(len({r["step"] for r in run.metrics if "step" in r}) / 25)) for run in runs}
    for run in runs:
        data["runs"].append({"label": run.label, "smoothing_window": windows[run.label], "series": {}})
    for ax, (key, panel_title, ylabel, val_key) in zip(axes, panels):
        for run, color, record in zip(runs, colors, data["runs"]):
            record["series"] |= _draw_series(ax, run.metrics, color, key, val_key, windows[run.label])
        drawn_any = any(key in r["series"] or val_key in r["series"] for r in data["runs"])
        ax.set_title(panel_title, loc="left")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if key in FRACTION_KEYS and drawn_any:
            _percent_axis(ax.yaxis)
            _fraction_limits(ax)
        if not drawn_any:
            ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color=GREY)
            ax.set_yticks([])
        _mark_phases(ax, runs, colors, spans, shared, names=ax is axes[0])
        for run, color in zip(runs, colors):
            for stop in stops[run.label]:
                ax.axvline(stop["step"], color=color, lw=1.3, ls="-.", zorder=1)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax in axes[len(panels) - cols:len(panels)]:
        ax.set_xlabel("RL step")
        ax.xaxis.set_tick_params(labelbottom=True)
    handles = [Line2D([], [], color=c, lw=1.7, label=r.label) for r, c in zip(runs, colors)]
    if any(w > 1 for w in windows.values()):
        handles.append(Line2D([], [], color=GREY, lw=2.5, alpha=0.3, label="per step"))
        handles.append(Line2D([], [], color=GREY, lw=1.7, label="moving average"))
    if any(key.startswith("val_") for r in data["runs"] for key in r["series"]):
        handles.append(Line2D([], [], ls=(0, (3, 2)), marker="D", ms=4, color=GREY, mfc="white", label="validation"))
    if shared:
        handles.append(Patch(color="#000000", alpha=0.08, lw=0, label="curriculum phases"))
    elif any(spans.values()):
        handles.append(Line2D([], [], ls=(0, (2, 2)), color=GREY, label="phase boundary"))
    if any(stops.values()):
        handles.append(Line2D([], [], ls="-.", lw=1.3, color=GREY, label="early stop (rolled back)"))
    fig.legend(handles=handles, loc="outside upper center", ncols=min(len(handles), 6))
    return fig, data


def _draw_series(ax, records, color: str, key: str, val_key: str | None, window: int) -> dict[str, Any]:
    """One run's curve of `key` (faint per step and a moving average when long) and its validation
    points; returns the series drawn."""
    drawn = {}
    steps, values = series(records, key)
    if steps:
        if window > 1:
            ax.plot(steps, values, color=color, lw=0.8, alpha=0.25)
            ax.plot(steps, moving_average(values, window), color=color, lw=1.7)
        else:
            ax.plot(steps, values, color=color, lw=1.7, marker="o" if len(steps) < 12 else None, ms=3.5)
        drawn[key] = {"steps": steps, "values": values}
    vsteps, vvalues = series(records, val_key) if val_key else ([], [])
    if vsteps:
        ax.plot(vsteps, vvalues, ls=(0, (3, 2)), marker="D", ms=4, lw=1.0, color=color, mfc="white", mew=1.3)
        drawn[val_key] = {"steps": vsteps, "values": vvalues}
    return drawn


def _mark_phases(ax, runs, colors, spans, shared, names: bool) -> None:
    """Shade phases when every run has the same ones; otherwise dashed boundaries in each run's colour."""
    label = {"xycoords": ("data", "axes fraction"), "textcoords": "offset points", "va": "top", "fontsize": 8,
             "annotation_clip": False}
    if shared:
        for i, (phase, start, end) in enumerate(shared):
            ax.axvspan(start, end, color="#000000", alpha=0.08 if i % 2 == 0 else 0.025, lw=0, zorder=0)
            if names:
                ax.annotate(phase, ((start + end) / 2, 1.0), xytext=(0, -3), ha="center", color=GREY, **label)
        return
    for run, color in zip(runs, colors):
        for i, (phase, start, _) in enumerate(spans[run.label]):
            if i > 0:
                ax.axvline(start, color=color, lw=1.0, ls=(0, (2, 2)), alpha=0.8, zorder=1)
            if names:
                ax.annotate(phase, (start, 1.0), xytext=(3, -3), ha="left", color=color, **label)


# ---------------------------------------------------------------------------------------------
# 4. length and accuracy change per difficulty
# ---------------------------------------------------------------------------------------------


def _level_key(level: str) -> tuple[int, float | str]:
    return (0, float(level)) if level.lstrip("-").isdigit() else (1, level)


def change_by_level(runs: list[RunResults], colors: list[str]) -> Drawn | Omitted:
    moved = [(r, c) for r, c in zip(runs, colors) if r.has_progress()]
    if not moved:
        return Omitted("change_by_level", "Change per difficulty", NEEDS_TWO)
    fig = _figure(11.0, 4.4)
    ax_tokens, ax_acc = fig.subplots(1, 2)
    levels = sorted({lv for r, _ in moved for lv in r.chosen.result["by_level"]}, key=_level_key)
    data: dict[str, Any] = {"levels": levels, "runs": [],
                            "skipped": [r.label for r in runs if not r.has_progress()]}
    width = 0.8 / max(1, len(moved))
    for j, (run, color) in enumerate(moved):
        before, after = run.first.result["by_level"], run.chosen.result["by_level"]
        tokens_change, acc_change = [], []
        for level in levels:
            b, a = before.get(level, {}), after.get(level, {})
            tokens_change.append(change_pct(value(b, "tokens_mean"), value(a, "tokens_mean")))
            acc_change.append(100.0 * (value(a, "accuracy") - value(b, "accuracy")))
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(levels))]
        label = f"{run.label}: {run.first.checkpoint} → {run.chosen.checkpoint}"
        bars_t = ax_tokens.bar(xs, tokens_change, width * 0.92, color=color, label=label)
        bars_a = ax_acc.bar(xs, acc_change, width * 0.92, color=color)
        if len(moved) <= 3 and len(levels) <= 8:
            ax_tokens.bar_label(bars_t, labels=[_signed(v, "%") for v in tokens_change], fontsize=7.5, padding=2)
            ax_acc.bar_label(bars_a, labels=[_signed(v, "") for v in acc_change], fontsize=7.5, padding=2)
        data["runs"].append({"label": run.label, "from": run.first.checkpoint, "to": run.chosen.checkpoint,
                             "tokens_change_pct": _nan_to_none(tokens_change), "accuracy_change_pp": _nan_to_none(acc_change)})
    for ax, ylabel, title in ((ax_tokens, "change in mean tokens (%)", "Length change per difficulty"),
                              (ax_acc, "change in accuracy (percentage points)", "Accuracy change per difficulty")):
        ax.axhline(0, color="#333333", lw=0.9)
        ax.margins(y=0.15)
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, -1.0), max(hi, 1.0))           # all-zero changes: a readable scale, not 1e-17
        ax.set_xticks(range(len(levels)), [f"level {lv}" if lv != "None" else "no level" for lv in levels])
        ax.set_ylabel(ylabel)
        ax.set_title(title, loc="left")
        ax.grid(axis="x", visible=False)
    fig.legend(loc="outside upper center", ncols=min(len(moved), 3))
    return Drawn(
        "change_by_level", "Change per difficulty",
        "From each run's first evaluated checkpoint to its chosen one: relative change of mean response tokens, "
        "and change of accuracy, per difficulty level. A penalty that removes necessary steps shortens hard "
        "problems and costs their accuracy; one that removes only redundancy shortens easy ones most.",
        fig, data,
    )


def _signed(v: float, unit: str) -> str:
    if math.isnan(v):
        return ""
    return f"0{unit}" if round(v) == 0 else f"{round(v):+d}{unit}"


# ---------------------------------------------------------------------------------------------
# 5. length histograms, correct vs wrong
# ---------------------------------------------------------------------------------------------


def length_histograms(runs: list[RunResults], colors: list[str]) -> Drawn:
    """Bins are as wide as their token range (8, 8, 8, 8, 16, 16, 32, … tokens) and bar heights are
    shares per token, so a bar's area is its share of responses."""
    edges = runs[0].chosen.result["length_hist"]["edges"]
    last_used = 0
    for run in runs:
        for e in (run.first, run.chosen):
            h = e.result["length_hist"]
            if h["edges"] != edges:
                raise ValueError(f"run {run.label}: length histogram bins {h['edges']} differ from {edges}; "
                                 "compare evaluations made with the same taut version")
            counts = [c + w for c, w in zip(h["correct"], h["wrong"])]
            last_used = max([last_used] + [i for i, c in enumerate(counts) if c])
    bins = list(range(last_used + 1))
    labels = [f"{edges[i]}–{edges[i + 1]}" for i in bins]
    if last_used == len(edges) - 2:
        labels[-1] = f"≥{edges[last_used]}"
    left = [edges[i] for i in bins]
    width = [edges[i + 1] - edges[i] for i in bins]
    cols = 2 if len(runs) in (2, 4) else min(3, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig = _figure(11.0 if cols > 1 else 8.0, (3.6 if cols < 3 else 3.2) * rows + 0.5)
    axes = fig.subplots(rows, cols, sharey=True, squeeze=False).ravel()
    data: dict[str, Any] = {"edges": edges, "bins": labels, "runs": []}
    for ax, run, color in zip(axes, runs, colors):
        h, h0 = run.chosen.result["length_hist"], run.first.result["length_hist"]
        total = sum(h["correct"]) + sum(h["wrong"])
        total0 = sum(h0["correct"]) + sum(h0["wrong"])
        correct = [h["correct"][i] / total / width[j] if total else 0.0 for j, i in enumerate(bins)]
        wrong = [h["wrong"][i] / total / width[j] if total else 0.0 for j, i in enumerate(bins)]
        ax.bar(left, correct, width, align="edge", color=CORRECT, edgecolor="white", linewidth=0.8)
        ax.bar(left, wrong, width, align="edge", bottom=correct, color=WRONG, edgecolor="white", linewidth=0.8)
        record = {"label": run.label, "checkpoint": run.chosen.checkpoint,
                  "correct": [h["correct"][i] for i in bins], "wrong": [h["wrong"][i] for i in bins]}
        if run.has_progress():
            first = [(h0["correct"][i] + h0["wrong"][i]) / total0 / width[j] if total0 else 0.0 for j, i in enumerate(bins)]
            ax.step(left + [edges[bins[-1] + 1]], first + first[-1:], where="post", color="#222222", lw=1.3)
            record.update({"first_checkpoint": run.first.checkpoint,
                           "first_total": [h0["correct"][i] + h0["wrong"][i] for i in bins]})
        ax.set_title(f"{run.label} ({run.chosen.checkpoint})", loc="left", color=color)
        ticks = edges[:last_used + 2]
        ax.set_xticks(ticks, [str(t) for t in ticks[:-1]] + [labels[-1] if labels[-1].startswith("≥") else str(ticks[-1])],
                      fontsize=8.5)
        ax.set_xlim(0, ticks[-1])
        ax.set_xlabel("response length (tokens)")
        ax.grid(axis="x", visible=False)
        _percent_axis(ax.yaxis)
        data["runs"].append(record)
    for ax in axes[::cols]:
        ax.set_ylabel("share of responses per token")
    for ax in axes[len(runs):]:
        ax.set_visible(False)
    handles = [Patch(color=CORRECT, label="correct"), Patch(color=WRONG, label="wrong")]
    if any(r.has_progress() for r in runs):
        handles.append(Line2D([], [], color="#222222", lw=1.3, label="all responses, first evaluated checkpoint"))
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles))
    return Drawn(
        "length_histograms", "Response lengths, correct vs. wrong",
        "Lengths of the chosen checkpoint's responses, split into correct and wrong (stacked). Bins are as wide "
        "as the token ranges they cover (8 tokens up to 32, then wider), and heights are shares per token, so "
        "each bar's area is its share of all responses; the black outline is the first evaluated checkpoint. "
        "Long wrong responses are the usual sign of overthinking or of hitting the generation cap.",
        fig, data,
    )


# ---------------------------------------------------------------------------------------------
# 6. in-domain vs held-out
# ---------------------------------------------------------------------------------------------


def transfer(runs: list[RunResults], colors: list[str]) -> Drawn | Omitted:
    """In-domain and held-out accuracy and tokens, first → chosen, when any run has held-out samples."""
    if not any(run.chosen.result["held_out"].get("n_samples") for run in runs):
        return Omitted("transfer", "In-domain vs. held-out",
                       "the evaluations have no held-out tasks (on the testbed: evaluate gym:all or gym:held-out).")
    fig = _figure(9.0, 5.0)
    ax = fig.add_subplot()
    data: dict[str, Any] = {"runs": []}
    for run, color in zip(runs, colors):
        record: dict[str, Any] = {"label": run.label, "from": run.first.checkpoint, "to": run.chosen.checkpoint}
        for split, marker, ls in (("in_domain", "o", "-"), ("held_out", "^", "--")):
            b, a = run.first.result[split], run.chosen.result[split]
            if not a.get("n_samples"):
                continue
            xy0 = (value(b, "tokens_mean"), value(b, "accuracy")) if b.get("n_samples") else None
            xy1 = (value(a, "tokens_mean"), value(a, "accuracy"))
            ax.plot(*xy1, marker=marker, ms=9, color=color, ls="", zorder=4)
            if xy0 is not None and run.has_progress():
                ax.plot(*xy0, marker=marker, ms=8, mfc="white", mec=color, mew=1.6, ls="", zorder=3)
                ax.annotate("", xy1, xy0, arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.4, "ls": ls,
                                                      "shrinkA": 5, "shrinkB": 6, "mutation_scale": 12}, zorder=2)
            record[split] = {"before": _nan_to_none(list(xy0)) if xy0 else None, "after": _nan_to_none(list(xy1))}
        data["runs"].append(record)
    ax.margins(0.12)
    _percent_axis(ax.yaxis)
    _fraction_limits(ax)
    ax.set_xlabel("mean response length (tokens)")
    ax.set_ylabel("accuracy")
    handles = [Line2D([], [], color=c, lw=1.6, label=r.label) for r, c in zip(runs, colors)]
    handles += [Line2D([], [], color=GREY, marker="o", ls="-", ms=7, label="in-domain"),
                Line2D([], [], color=GREY, marker="^", ls="--", ms=7, label="held-out")]
    if any(r.has_progress() for r in runs):
        handles.append(Line2D([], [], color=GREY, marker="o", ls="", ms=7, mfc="white", mew=1.5, label="first checkpoint"))
    _legend_beside(ax, handles)
    return Drawn(
        "transfer", "In-domain vs. held-out",
        "Accuracy and mean tokens on the domains RL trained on and on held-out domains it never saw. "
        "Arrows run from the first evaluated checkpoint to the chosen one: compression that transfers moves "
        "both arrows left.",
        fig, data,
    )


def draw_all(runs: list[RunResults], colors: list[str]) -> list[Drawn | Omitted]:
    with matplotlib.rc_context(STYLE):
        return [
            accuracy_vs_tokens(runs, colors),
            budget_accuracy(runs, colors),
            training_dynamics(runs, colors),
            strategy_signals(runs, colors),
            change_by_level(runs, colors),
            length_histograms(runs, colors),
            transfer(runs, colors),
        ]

"""The transfer view: length and score change on the training domain and on each unseen suite,
side by side (the shape of the mastery-gated paper's first figure, arXiv 2601.06052).

For every run, from its first evaluated checkpoint to its chosen one, per evaluated domain
(`by_domain` of the evaluation JSON: the training data's domain, and the unseen suites `code`,
`ifeval`, `qa`, …): mean response tokens before → after and their relative change, and score
before → after and its change in percentage points. The score is the domain's accuracy: pass@1
for code, prompt-level strict accuracy for IFEval, exact match for QA, the verifier's verdict for
math. A domain is *unseen* when its problems are held out (never trained on by RL recipes); the
evaluation lists them in `held_out_domains`.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib
from rich import box
from rich.table import Table

from taut.lab.report.figures import (
    NEEDS_TWO,
    STYLE,
    Drawn,
    Omitted,
    _figure,
    _nan_to_none,
    _signed,
)
from taut.lab.report.runs import RunResults, change_pct, value

NAME, TITLE = "transfer_by_suite", "Transfer: training domain vs. unseen suites"


def suite_rows(first: dict[str, Any], chosen: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per domain of the `chosen` evaluation against the `first` one (evaluation JSONs):
    trained domains first, then unseen ones."""
    before, after = first.get("by_domain", {}), chosen.get("by_domain", {})
    unseen = set(chosen.get("held_out_domains", []))
    rows = []
    for domain in sorted(after, key=lambda d: (d in unseen, d)):
        b, a = before.get(domain, {}), after[domain]
        tokens = (value(b, "tokens_mean"), value(a, "tokens_mean"))
        score = (value(b, "accuracy"), value(a, "accuracy"))
        rows.append({
            "domain": domain, "role": "unseen" if domain in unseen else "trained",
            "n_problems": a.get("n_problems"), "samples": a.get("n_samples"),
            "tokens_before": tokens[0], "tokens_after": tokens[1], "tokens_change_pct": change_pct(*tokens),
            "score_before": score[0], "score_after": score[1], "score_change_pp": 100.0 * (score[1] - score[0]),
            "scores_after": a.get("scores"),
        })
    return rows


def transfer_by_suite(runs: list[RunResults], colors: list[str]) -> Drawn | Omitted:
    """Bars of length change and score change per domain, one colour per run."""
    moved = [(r, c) for r, c in zip(runs, colors) if r.has_progress()]
    if not moved:
        return Omitted(NAME, TITLE, NEEDS_TWO)
    tables = {run.label: suite_rows(run.first.result, run.chosen.result) for run, _ in moved}
    domains = list(dict.fromkeys(row["domain"] for rows in tables.values() for row in rows))
    if len(domains) < 2:
        return Omitted(NAME, TITLE, "the evaluations cover a single domain: add unseen suites to eval.tasks, "
                                    "e.g. code:humaneval, ifeval, qa (docs/transfer.md).")
    roles = {row["domain"]: row["role"] for rows in tables.values() for row in rows}
    with matplotlib.rc_context(STYLE):
        fig = _figure(max(8.0, 1.6 * len(domains) + 4.0), 4.4)
        ax_tokens, ax_score = fig.subplots(1, 2)
        width = 0.8 / len(moved)
        for j, (run, color) in enumerate(moved):
            by_domain = {row["domain"]: row for row in tables[run.label]}
            tokens = [by_domain[d]["tokens_change_pct"] if d in by_domain else math.nan for d in domains]
            scores = [by_domain[d]["score_change_pp"] if d in by_domain else math.nan for d in domains]
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(domains))]
            label = f"{run.label}: {run.first.checkpoint} → {run.chosen.checkpoint}"
            bars_t = ax_tokens.bar(xs, tokens, width * 0.92, color=color, label=label)
            bars_s = ax_score.bar(xs, scores, width * 0.92, color=color)
            if len(moved) <= 3:
                ax_tokens.bar_label(bars_t, labels=[_signed(v, "%") for v in tokens], fontsize=7.5, padding=2)
                ax_score.bar_label(bars_s, labels=[_signed(v, "") for v in scores], fontsize=7.5, padding=2)
        names = [f"{d}\n({roles[d]})" for d in domains]
        for ax, ylabel, title in ((ax_tokens, "change in mean tokens (%)", "Response length"),
                                  (ax_score, "change in score (percentage points)", "Score")):
            ax.axhline(0, color="#333333", lw=0.9)
            ax.margins(y=0.15)
            lo, hi = ax.get_ylim()
            ax.set_ylim(min(lo, -1.0), max(hi, 1.0))
            ax.set_xticks(range(len(domains)), names)
            ax.set_ylabel(ylabel)
            ax.set_title(title, loc="left")
            ax.grid(axis="x", visible=False)
        fig.legend(loc="outside upper center", ncols=min(len(moved), 3))
    data = {"domains": domains, "roles": roles, "skipped": [r.label for r in runs if not r.has_progress()],
            "runs": [{"label": run.label, "from": run.first.checkpoint, "to": run.chosen.checkpoint,
                      "rows": [_finite_row(row) for row in tables[run.label]]} for run, _ in moved]}
    return Drawn(
        NAME, TITLE,
        "From each run's first evaluated checkpoint to its chosen one: relative change of mean response tokens "
        "and change of score, on the domain it trained on and on suites it never saw (code: HumanEval pass@1; "
        "ifeval: prompt-level strict accuracy; qa: exact match). Compression that transfers shortens every "
        "suite without lowering its score.",
        fig, data,
    )


def _finite_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (_nan_to_none([v])[0] if isinstance(v, float) else v) for k, v in row.items()}


def rich_table(rows: list[dict[str, Any]], title: str = "transfer") -> Table:
    """The transfer table for the terminal, from `suite_rows` (or the same rows read back from
    report.json, where missing values are None)."""
    t = Table(title=title, box=box.SIMPLE_HEAD)
    for col in ("domain", "role", "problems", "tokens", "Δ tokens", "score", "Δ score"):
        t.add_column(col, justify="left" if col in ("domain", "role") else "right")
    for row in rows:
        t.add_row(row["domain"], row["role"], str(row["n_problems"]),
                  f"{_num(row['tokens_before'], '.1f')} → {_num(row['tokens_after'], '.1f')}", _fmt(row["tokens_change_pct"], "%"),
                  f"{_num(row['score_before'], '.1%')} → {_num(row['score_after'], '.1%')}", _fmt(row["score_change_pp"], "pp"))
    return t


def _num(v: float | None, spec: str) -> str:
    return "–" if v is None or math.isnan(v) else format(v, spec)


def _fmt(v: float | None, unit: str) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:+.1f}{unit}"

"""The report: the Pareto frontier on hand-made points, and `taut compare` end to end on two tiny runs
whose plotted numbers must equal the evaluation JSONs they come from."""

import base64
import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from taut.cli import app
from taut.config import RunConfig
from taut.lab.report import compare, pareto_frontier
from taut.lab.report.figures import moving_average, phase_spans
from taut.lab.report.summary import strategy_plan

# ---------------------------------------------------------------------------------------------
# the frontier
# ---------------------------------------------------------------------------------------------


def test_pareto_frontier_keeps_exactly_the_non_dominated_points():
    points = [
        (10, 0.5),            # 0 on: nothing shorter is as accurate
        (20, 0.7),            # 1 on
        (15, 0.5),            # 2 dominated by 0 (same accuracy, more tokens)
        (30, 0.7),            # 3 dominated by 1
        (5, 0.2),             # 4 on: the shortest
        (20, 0.7),            # 5 on: an exact duplicate of 1
        (math.nan, 0.9),      # 6 never on the frontier
        (40, 0.9),            # 7 on: the most accurate
        (40, 0.6),            # 8 dominated by 7 (same tokens, less accuracy) and by 1
        (25, 0.65),           # 9 dominated by 1 (more tokens, less accuracy)
    ]
    assert pareto_frontier(points) == [4, 0, 1, 5, 7]


def test_pareto_frontier_edge_cases():
    assert pareto_frontier([]) == []
    assert pareto_frontier([(3.0, 0.1)]) == [0]
    assert pareto_frontier([(3.0, 0.1), (3.0, 0.1)]) == [0, 1]
    assert pareto_frontier([(1.0, 0.0), (2.0, 0.0)]) == [0]                   # equal accuracy: the shorter wins
    assert pareto_frontier([(1.0, 0.3), (2.0, 0.2), (0.5, 0.9)]) == [2]       # one point dominates all


def test_phase_spans_and_smoothing():
    records = [{"step": 1, "phase": "accuracy"}, {"step": 2, "phase": "accuracy"}, {"step": 2, "val_accuracy": 0.5},
               {"step": 3, "phase": "compression"}, {"step": 4, "phase": "accuracy"}]
    assert phase_spans(records) == [("accuracy", 0.5, 2.5), ("compression", 2.5, 3.5), ("accuracy", 3.5, 4.5)]
    assert phase_spans([{"step": 1, "accuracy": 0.1}]) == []
    assert moving_average([1.0, 2.0, 3.0, 4.0], 3) == [1.5, 2.0, 3.0, 3.5]


def test_strategy_plan_names_each_phase_strategy_in_order():
    records = [{"step": 0, "phase": "accuracy", "event": "phase-start"},
               {"step": 1, "phase": "accuracy", "strategy": "none"}, {"step": 2, "phase": "compression", "strategy": "siri"},
               {"step": 3, "phase": "compression", "strategy": "siri"}, {"step": 4, "phase": "recovery", "strategy": "none"}]
    assert strategy_plan(records) == "accuracy: none → compression: siri → recovery: none"
    assert strategy_plan([{"step": 1, "phase": "main", "strategy": "kimi"}, {"step": 2, "strategy": "kimi"}]) == "kimi"
    assert strategy_plan([]) is None


# ---------------------------------------------------------------------------------------------
# two tiny runs, each evaluated at two checkpoints
# ---------------------------------------------------------------------------------------------


def micro_config(seed: int) -> RunConfig:
    return RunConfig.model_validate({
        "seed": seed,
        "model": {"preset": "tiny", "threads": 1},
        "data": {"pool_per_level": 2, "eval": ["gym:add"]},
        "rl": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 8},
        "eval": {"n_per_level": 2, "samples": 2},
    })


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from taut.checkpoint import list_checkpoints
    from taut.rl.trainer import train_rl
    from taut.workflows import evaluate_target

    root = tmp_path_factory.mktemp("runs")
    runs = []
    for seed in (0, 1):
        config, run = micro_config(seed), root / f"run{seed}"
        train_rl(config, run, quiet=True)
        checkpoints = list_checkpoints(run)
        assert [c.name for c in checkpoints] == ["step-000000", "step-000002"]
        for checkpoint in checkpoints:
            evaluate_target(config, checkpoint, run / "eval" / f"{checkpoint.name}.json")
        runs.append(run)
    return runs


def evals(run):
    return {p.stem: json.loads(p.read_text()) for p in sorted((run / "eval").glob("*.json"))}


def test_compare_command_writes_a_self_contained_report_of_the_eval_numbers(two_runs, tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["compare", *map(str, two_runs), "--out", str(out), "--label", "first", "--label", "second"])
    assert result.exit_code == 0, result.output
    assert "written:" in result.output and "report.html" in result.output

    html = (out / "report.html").read_text()
    report = json.loads((out / "report.json").read_text())
    names = set(report["figures"])
    assert {"accuracy_vs_tokens", "budget_accuracy", "training_dynamics", "change_by_level", "length_histograms"} <= names
    for name, figure in report["figures"].items():
        png = (out / figure["file"]).read_bytes()
        assert png.startswith(b"\x89PNG"), name
        assert base64.b64encode(png).decode() in html, f"{name} is not embedded"
    assert "<link" not in html and "<script" not in html and 'src="http' not in html   # nothing external

    pareto, budget = report["figures"]["accuracy_vs_tokens"]["data"], report["figures"]["budget_accuracy"]["data"]
    hist, change = report["figures"]["length_histograms"]["data"], report["figures"]["change_by_level"]["data"]
    for label, run, drawn, budgeted, histogram, changed, row in zip(
            ("first", "second"), two_runs, pareto["runs"], budget["runs"], hist["runs"], change["runs"], report["table"]):
        e = evals(run)
        first, last = e["step-000000"], e["step-000002"]
        assert drawn["label"] == label and drawn["steps"] == [0, 2]
        assert drawn["tokens_mean"] == [first["overall"]["tokens_mean"], last["overall"]["tokens_mean"]]
        assert drawn["accuracy"] == [first["overall"]["accuracy"], last["overall"]["accuracy"]]
        assert budgeted["checkpoint"] == "step-000002"                                  # no selection: the latest
        assert budgeted["budgets"] == last["eval"]["budgets"]
        assert budgeted["accuracy"] == [last["overall"]["budget_accuracy"][str(b)] for b in last["eval"]["budgets"]]
        n = len(histogram["correct"])
        assert histogram["correct"] == last["length_hist"]["correct"][:n]
        assert histogram["wrong"] == last["length_hist"]["wrong"][:n]
        assert sum(histogram["correct"]) + sum(histogram["wrong"]) == last["overall"]["n_samples"]   # trimmed bins are empty
        for level, pct in zip(change["levels"], changed["tokens_change_pct"]):
            b, a = first["by_level"][level]["tokens_mean"], last["by_level"][level]["tokens_mean"]
            assert pct == pytest.approx(100 * (a - b) / b)
        assert row["accuracy"] == last["overall"]["accuracy"]
        assert row["tokens_mean"] == last["overall"]["tokens_mean"]
        assert row["tokens_p90"] == last["overall"]["tokens_p90"]
        assert row["tokens_change_pct"] == pytest.approx(
            100 * (last["overall"]["tokens_mean"] - first["overall"]["tokens_mean"]) / first["overall"]["tokens_mean"])
        assert row["held_out_accuracy"] is None                                        # gym:add has no held-out part
        assert row["tokens_per_correct"] == last["overall"]["tokens_per_correct"]

    assert "efficiency" in result.output and "overthinking" in result.output
    points = [(t, a) for r in pareto["runs"] for t, a in zip(r["tokens_mean"], r["accuracy"])]
    expected = [points[i] for i in pareto_frontier(points)]
    assert [(f["tokens_mean"], f["accuracy"]) for f in pareto["frontier"]] == expected

    metrics = [json.loads(line) for line in (two_runs[0] / "metrics.jsonl").read_text().splitlines()]
    metrics = [r for r in metrics if r.get("length_mean") is not None]          # step records, not events
    length = report["figures"]["training_dynamics"]["data"]["runs"][0]["series"]["length_mean"]
    assert length == {"steps": [r["step"] for r in metrics], "values": [r["length_mean"] for r in metrics]}


def test_report_follows_the_selection_and_draws_phases_and_validation(two_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(two_runs[0], run, ignore=shutil.ignore_patterns("*.safetensors"))
    (run / "selection.json").write_text(json.dumps({"checkpoint": "step-000000"}))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    records = [{**r, "phase": "accuracy" if r["step"] == 1 else "compression"} for r in records]
    records.append({"step": 2, "val_accuracy": 0.25, "val_tokens_mean": 6.5})
    records.append({"step": 2, "phase": "compression", "event": "early-stop", "detector": "entropy", "rolled_back_to": None})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    path = compare([run], tmp_path / "report")
    report = json.loads((path.parent / "report.json").read_text())
    assert report["figures"]["budget_accuracy"]["data"]["runs"][0]["checkpoint"] == "step-000000"
    assert "taut eval" in report["omitted"]["change_by_level"]                         # chosen = first: no change
    dynamics = report["figures"]["training_dynamics"]["data"]
    assert dynamics["phases"]["run"] == [["accuracy", 0.5, 1.5], ["compression", 1.5, 2.5]]
    assert dynamics["early_stops"]["run"] == [{"step": 2, "detector": "entropy", "rolled_back_to": None}]
    assert dynamics["runs"][0]["series"]["val_accuracy"] == {"steps": [2], "values": [0.25]}
    assert dynamics["runs"][0]["series"]["val_tokens_mean"] == {"steps": [2], "values": [6.5]}


def test_compare_errors_say_what_to_do(two_runs, tmp_path):
    empty = tmp_path / "no-evals"
    empty.mkdir()
    with pytest.raises(ValueError, match="taut eval"):
        compare([empty], tmp_path / "out")
    with pytest.raises(ValueError, match="one --label per run"):
        compare(two_runs, tmp_path / "out", labels=["only-one"])
    # a missing run is named, not the other run's missing evaluations
    with pytest.raises(FileNotFoundError, match=r"^no such run directory: .*absent$"):
        compare([empty, tmp_path / "absent"], tmp_path / "out")


def test_compare_reports_overthinking_and_underthinking_from_the_samples(two_runs, tmp_path):
    """Samples written by hand into copies of the runs: the report's measures, by hand."""
    def samples(run, name, rows):
        (run / "eval" / f"{name}.samples.jsonl").write_text(
            "".join(json.dumps({"problem_id": p, "length": n, "correct": c}) + "\n" for p, n, c in rows))

    a, b = tmp_path / "a", tmp_path / "b"
    for src, dst in zip(two_runs, (a, b)):
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors"))
    samples(a, "step-000000", [("p", 40, True), ("p", 40, True), ("q", 60, True), ("q", 60, False)])
    samples(a, "step-000002", [("p", 10, True), ("p", 30, False), ("q", 20, False), ("q", 20, False)])
    samples(b, "step-000000", [("p", 50, False), ("p", 50, False), ("q", 70, False), ("q", 70, False)])
    samples(b, "step-000002", [("p", 8, True), ("p", 12, True), ("q", 30, True), ("q", 50, False)])
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "report" / "report.json").read_text())["table"]
    # shortest correct over all four evaluations: p 8 (b, step 2), q 30 (b, step 2)
    assert rows[0]["overthinking_tokens"] == pytest.approx(((20 - 8) + (20 - 30)) / 2)
    assert rows[1]["overthinking_tokens"] == pytest.approx(((10 - 8) + (40 - 30)) / 2)
    # a's start solved p (1) and q (1/2): now 1/2 and 0 → lost (1/2 + 1/2) / 2; b's start solved nothing
    assert rows[0]["underthinking_pp"] == pytest.approx(50.0) and rows[0]["underthinking_problems"] == 2
    assert rows[1]["underthinking_pp"] is None and rows[1]["underthinking_problems"] == 0
    assert "efficiency" in result.output and "+50.0pp" in result.output


def phased_run(two_runs, tmp_path) -> Path:
    """A copy of a run as if trained in two phases, accuracy (steps 0–1) then compression (1–2),
    with its three boundary checkpoints evaluated."""
    run = tmp_path / "phased"
    shutil.copytree(two_runs[0], run, ignore=shutil.ignore_patterns("*.safetensors"))
    start = json.loads((run / "eval" / "step-000000.json").read_text())
    middle = json.loads(json.dumps(start))
    middle["overall"]["tokens_mean"] = start["overall"]["tokens_mean"] * 1.25       # the accuracy phase lengthens
    middle["overall"]["accuracy"] = min(1.0, start["overall"]["accuracy"] + 0.1)
    (run / "eval" / "step-000001.json").write_text(json.dumps(middle))
    (run / "curriculum.json").write_text(json.dumps({"phases": [
        {"name": "accuracy", "start_step": 0, "end_step": 1, "strategy": "none", "ended_by": "steps"},
        {"name": "compression", "start_step": 1, "end_step": 2, "strategy": "mastery-gated", "ended_by": "steps"}]}))
    return run


def test_each_phase_is_measured_against_the_one_before_and_the_compression_phase_is_the_headline(two_runs, tmp_path):
    run = phased_run(two_runs, tmp_path)
    e = evals(run)
    path = compare([run], tmp_path / "report")
    row = json.loads((path.parent / "report.json").read_text())["table"][0]
    accuracy_phase, compression_phase = row["phases"]
    tokens = {name: e[name]["overall"]["tokens_mean"] for name in e}
    assert accuracy_phase["tokens_change_pct"] == pytest.approx(25.0)                 # vs. the start
    assert compression_phase["tokens_change_pct"] == pytest.approx(
        100 * (tokens["step-000002"] / tokens["step-000001"] - 1))                     # vs. the accuracy phase
    assert compression_phase["accuracy_change_pp"] == pytest.approx(
        100 * (e["step-000002"]["overall"]["accuracy"] - e["step-000001"]["overall"]["accuracy"]))
    assert row["tokens_change_pct"] == compression_phase["tokens_change_pct"]         # the headline
    assert row["change_over"] == "compression phase (mastery-gated) vs. accuracy"
    html = path.read_text()
    assert "compression phase (mastery-gated) vs. accuracy" in html and "By phase" in html
    assert f"{compression_phase['tokens_change_pct']:+.1f}%" in html


def test_length_histogram_bars_are_as_wide_as_their_bins(two_runs):
    from taut.lab.report.figures import length_histograms
    from taut.lab.report.runs import load_run

    drawn = length_histograms([load_run(two_runs[0], "run")], ["#0072B2"])
    edges = drawn.data["edges"]
    ax = drawn.figure.axes[0]
    bars = sorted({(round(p.get_x(), 6), round(p.get_width(), 6)) for p in ax.patches})
    assert bars == [(edges[i], edges[i + 1] - edges[i]) for i in range(len(bars))]
    assert len({w for _, w in bars}) > 1 or len(bars) <= 4                      # 8-token bins, then wider ones
    # heights are shares per token: the bars' areas add up to 1
    area = sum(p.get_width() * p.get_height() for p in ax.patches)
    assert area == pytest.approx(1.0)


def test_a_fixed_cap_is_said_not_drawn(two_runs):
    from taut.lab.report.figures import training_dynamics
    from taut.lab.report.runs import load_run

    drawn = training_dynamics([load_run(two_runs[0], "run")], ["#0072B2"])
    assert drawn.data["fixed_cap"] == 8
    assert "cap" not in drawn.data["runs"][0]["series"] and "stayed at 8 tokens" in drawn.caption
    assert "Length cap L(t)" not in [ax.get_title(loc="left") for ax in drawn.figure.axes]


def test_panel_axis_labels_do_not_collide(two_runs, tmp_path):
    from taut.lab.report.figures import STRATEGY_PANELS, _step_panels
    from taut.lab.report.runs import load_run

    run = load_run(two_runs[0], "run")
    for record in run.metrics:                        # every strategy signal logged
        if "length_mean" in record:
            record.update({key: 0.5 for key, *_ in STRATEGY_PANELS})
    fig, _ = _step_panels([run], ["#0072B2"], [(*p, None) for p in STRATEGY_PANELS])
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    boxes = [ax.yaxis.label.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
    heights = [ax.get_window_extent(renderer).height for ax in fig.axes if ax.get_visible()]
    assert all(b.height <= h for b, h in zip(boxes, heights))
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])

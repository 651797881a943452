"""`taut bench --quick` end to end (slow: about two minutes)."""

import json

import pytest
from typer.testing import CliRunner

from taut.cli import app


@pytest.mark.slow
def test_bench_quick_runs_every_method_and_reports(tmp_path):
    out, md = tmp_path / "bench", tmp_path / "BENCHMARKS.md"
    result = CliRunner().invoke(app, ["bench", "--quick", "--out", str(out), "--write", str(md)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "bench.json").read_text())
    methods = {r["method"] for r in summary["rows"]}
    assert {"control", "mastery-curriculum", "siri-cosine (low)", "siri-cosine (high)", "dapo-heavy"} <= methods
    for row in summary["rows"]:
        assert 0 <= row["accuracy"] <= 1 and row["tokens"] > 0
    text = md.read_text()
    assert "| method |" in text and "## Targets" in text and "<!-- discussion -->" in text
    assert (out / "report" / "report.html").exists()


def test_a_resumed_matrix_reports_the_times_its_runs_took_when_they_ran(tmp_path):
    from taut.lab.bench.matrix import _recorded_seconds

    assert _recorded_seconds(tmp_path, 120.0, True) == (120.0, False)     # trained now: recorded
    assert _recorded_seconds(tmp_path, 0.3, False) == (120.0, True)      # found done: the time it took then
    older = tmp_path / "older"
    older.mkdir()
    assert _recorded_seconds(older, 0.3, False) == (0.3, True)           # no record: this invocation's, flagged


def test_the_timing_note_says_how_a_resumed_matrix_was_timed():
    from taut.lab.bench.matrix import timing_note

    assert timing_note({"timed": "wall", "resumed": []}) == ""
    assert "recorded when it ran" in timing_note({"timed": "record", "resumed": ["a", "b"]})
    assert "sum of its runs' recorded times; 1 found done" in timing_note({"timed": "sum", "resumed": ["a"]})


@pytest.mark.slow
def test_workers_run_methods_in_parallel_with_the_same_results(tmp_path):
    """`workers: 2` trains the methods in two processes; every run is seeded on its own, so the
    results equal those of one process running them in turn (slow: about a minute)."""
    from taut.lab.bench.matrix import BenchConfig, run_bench

    spec = {"model": "builtin:testbed-sft", "threads": 1, "start_steps": 2, "steps": 2,
            "rl": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 64, "dynamic_sampling": False, "checkpoint_every": 2},
            "eval": {"n_per_level": 2, "samples": 1},
            "methods": [{"name": "control", "strategy": {"name": "none"}}, {"name": "sigmoid", "strategy": {"name": "sigmoid"}}]}
    one = run_bench(BenchConfig.model_validate(spec), tmp_path / "one", None, "one")
    two = run_bench(BenchConfig.model_validate({**spec, "workers": 2}), tmp_path / "two", None, "two")
    assert set(one["results"]) == set(two["results"]) == {"control/seed0", "sigmoid/seed0"}
    for key in one["results"]:
        a, b = one["results"][key]["evals"]["final"], two["results"][key]["evals"]["final"]
        assert a["overall"] == b["overall"] and a["by_cell"] == b["by_cell"]
    # run again, everything is found done: the time is the wall clock recorded the first time
    again = run_bench(BenchConfig.model_validate({**spec, "workers": 2}), tmp_path / "two", None, "two")
    assert two["timed"] == "wall" and again["timed"] == "record" and again["seconds"] == two["seconds"]
    assert len(again["resumed"]) == 3


def test_the_matrix_adds_global_overthinking_and_underthinking_against_the_start(tmp_path):
    from taut.lab.bench.matrix import add_efficiency, efficiency_table, summarise

    def evaluation(name, samples, redundancy):
        path = tmp_path / "eval" / f"{name}.json"                       # as a run's RUN/eval/<checkpoint>.json
        path.parent.mkdir(exist_ok=True)
        with open(path.with_suffix(".samples.jsonl"), "w") as f:
            for pid, length, correct in samples:
                f.write(json.dumps({"problem_id": pid, "length": length, "correct": correct}) + "\n")
        rows = {"accuracy": sum(c for *_, c in samples) / len(samples), "tokens_mean": sum(n for _, n, _ in samples) / len(samples),
                "redundancy": redundancy, "tokens_per_correct": 1.0, "overthinking_tokens": 2.0}
        both = {"overall": rows, "in_domain": rows, "held_out": rows, "checkpoint": str(tmp_path / "checkpoints" / name),
                "by_level": {"1": {"tokens_mean": 1.0}, "4": {"accuracy": 1.0}}}
        return path, both

    start_path, start = evaluation("start", [("a", 40, True), ("a", 60, True), ("b", 50, True), ("b", 70, False)], 0.5)
    path, short = evaluation("short", [("a", 10, True), ("a", 20, False), ("b", 30, False), ("b", 30, False)], 0.1)
    results = {"short/seed0": {"method": "short", "run_dir": str(tmp_path), "evals": {"final": short}}}
    add_efficiency(start, start_path, results)
    # shortest correct anywhere: a 10, b 50; start spends a 50, b 60 → excess 40 and 10
    assert start["efficiency"] == {"overthinking_global": 25.0, "underthinking_pp": 0.0}
    # short: a 15 − 10, b 30 − 50; the start solved a (1.0) and b (0.5): it lost 0.5 and 0.5
    assert short["efficiency"] == {"overthinking_global": -7.5, "underthinking_pp": 50.0}
    lines = efficiency_table(start, summarise(start, results))
    assert "| start | 0.50 | 27.5 | 2.0 | 25.0 | 1.0 | 0.0 pts |" in lines
    assert "| short | 0.10 | 2.2 | 2.0 | -7.5 | 1.0 | 50.0 pts |" in lines

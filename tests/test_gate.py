"""The mastery gate ablation: with the gate off only unmastered groups' rewards change."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from taut.config import ConfigError, load_config
from taut.lab.bench.suite import level_stats, load_suite, suite_tables, write_section
from taut.length import REGISTRY, build_strategy
from taut.length.base import GroupBatch
from taut.length.mastery import MasteryGatedConfig, MasteryGatedNoGateConfig


def _batch():
    # group 0 mastered (all correct), group 1 mixed (a short lucky answer and two long searches),
    # group 2 one correct, group 3 none correct
    correct = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    lengths = torch.tensor([[10, 12, 20, 10], [4, 6, 40, 60], [5, 30, 9, 9], [3, 50, 7, 7]])
    return GroupBatch(correct=correct, lengths=lengths, truncated=torch.zeros_like(correct), step=0, cap=128,
                      prompt_ids=("p", "q", "r", "s"))


def test_only_the_gate_changes():
    on = build_strategy(MasteryGatedConfig(support=1)).shape(_batch())
    off = build_strategy(MasteryGatedConfig(support=1, gate=False)).shape(_batch())
    by_name = build_strategy(MasteryGatedNoGateConfig(support=1)).shape(_batch())
    # the mastered group: identical shaped rewards, penalty 0, 0.2, min(0.5, 1.0), 0
    expected_mastered = torch.tensor([1.0, 0.8, 0.5, 1.0])
    torch.testing.assert_close(on.rewards[0], expected_mastered)
    torch.testing.assert_close(off.rewards[0], expected_mastered)
    # the mixed group: gate on leaves correctness; gate off penalises the searches against the
    # short correct answer (safe length 4: excess 9 and 14, capped at 0.5)
    torch.testing.assert_close(on.rewards[1], torch.tensor([1.0, 0.0, 1.0, 1.0]))
    torch.testing.assert_close(off.rewards[1], torch.tensor([1.0, 0.0, 0.5, 0.5]))
    # one correct rollout is its group's shortest correct one; nothing correct: nothing to penalise
    for out in (on, off):
        torch.testing.assert_close(out.rewards[2:], _batch().correct[2:].float())
    torch.testing.assert_close(by_name.rewards, off.rewards)
    assert on.metrics["gate_open"] == 0.25 and off.metrics["gate_open"] == 1.0
    assert on.metrics["penalised_frac"] == pytest.approx(2 / 16) and off.metrics["penalised_frac"] == pytest.approx(4 / 16)
    assert on.metrics["safe_len_mean"] == 10.0


def test_gate_off_keeps_the_other_settings_and_the_memory():
    cfg = dict(tau=0.75, slack=0.5, alpha=0.5, max_penalty=0.3, use_best_seen=True)
    on, off = build_strategy(MasteryGatedConfig(support=1, **cfg)), build_strategy(MasteryGatedConfig(support=1, **cfg, gate=False))
    a, b = on.shape(_batch()), off.shape(_batch())
    # group 0 (p = 1) and group 1 (p = 0.75) are mastered at tau 0.75: identical
    torch.testing.assert_close(a.rewards[:2], b.rewards[:2])
    assert on.best_seen == off.best_seen == {"p": 10, "q": 4, "r": 30}


def test_nogate_by_name_in_recipes_and_the_registry():
    assert "mastery-gated-nogate" in REGISTRY
    config = load_config(None, ["strategy.name=mastery-gated-nogate", "strategy.alpha=0.5"])
    assert config.strategy.gate is False and config.strategy.alpha == 0.5
    assert build_strategy(config.strategy).name == "mastery-gated-nogate"
    assert load_config(None, ["strategy.name=mastery-gated"]).strategy.gate is True
    assert load_config(None, ["strategy.name=mastery-gated", "strategy.gate=false"]).strategy.gate is False
    with pytest.raises(ValueError):
        MasteryGatedNoGateConfig(gate=True)


# ---- the gate suite ---------------------------------------------------------------------------


ROOT = Path(__file__).parent.parent


def test_gate_suite_parses_and_expands_methods_strengths_and_seeds():
    suite = load_suite(ROOT / "recipes" / "bench-gate.yaml")
    methods = {m.name: m for m in suite.bench.methods}
    for family in ("gate-on", "gate-off"):
        runs = [m for name, m in methods.items() if name.startswith(f"{family}@alpha=")]
        assert [m.strategy.alpha for m in runs] == [0.25, 1.0, 4.0] and all(m.seeds == [0, 1] for m in runs)
    # gate on and gate off differ only in the gate
    for alpha in (0.25, 1.0, 4.0):
        on, off = methods[f"gate-on@alpha={alpha}"].strategy, methods[f"gate-off@alpha={alpha}"].strategy
        assert on.gate and not off.gate
        assert on.model_dump(exclude={"name", "gate"}) == off.model_dump(exclude={"name", "gate"})
    sampler = methods["gate-on+sampler"]
    assert sampler.strategy is None and sampler.phases[0].sampler.mastered_fraction == "adaptive"
    assert sampler.phases[0].steps == suite.bench.steps and sampler.phases[0].strategy == methods["gate-on@alpha=1.0"].strategy
    for family in ("dapo", "sigmoid", "siri", "dler", "alp", "shorter-better"):
        assert len([n for n in methods if n.startswith(f"{family}@")]) == 3
    # the support variant differs from gate-on@alpha=1.0 only in its support
    for support in (2, 4):
        variant = methods[f"gate-support@support={support}"].strategy
        assert variant.support == support
        assert variant.model_dump(exclude={"support"}) == methods["gate-on@alpha=1.0"].strategy.model_dump(exclude={"support"})
    off = methods["gate-support-off"].strategy
    assert not off.gate and off.model_dump(exclude={"name", "gate"}) == methods["gate-support@support=4"].strategy.model_dump(exclude={"name", "gate"})
    assert suite.bench.train == ["gym:train+search"] and "search" in suite.bench.eval.tasks[0]
    assert [c.family for c in suite.curves] == ["control", "gate-on", "gate-off", "gate-support", "gate-support-off", "gate-on+sampler",
                                                "curriculum", "dapo", "sigmoid", "siri", "dler", "alp", "shorter-better"]
    curriculum = methods["curriculum"]
    assert [p.strategy.name for p in curriculum.phases] == ["mastery-gated", "none"]
    assert curriculum.phases[0].strategy == methods["gate-on@alpha=1.0"].strategy
    assert curriculum.evaluate == {"compressed": 100, "final": 150} == {"compressed": curriculum.phases[0].steps, "final": suite.bench.steps}
    assert suite.compare == (("gate-on", "gate-off"), ("gate-support@support=2", "gate-on@alpha=1.0"),
                             ("gate-support@support=4", "gate-on@alpha=1.0"), ("gate-support@support=4", "gate-support-off"),
                             ("gate-on+sampler", "gate-on@alpha=1.0"),
                             ("curriculum", "curriculum (compressed)"))
    quick = load_suite(ROOT / "recipes" / "bench-gate.yaml", quick=True)
    assert suite.bench.model == quick.bench.model == "builtin:testbed-sft-gate" and quick.bench.steps < 10


def test_suite_errors_name_the_file_and_the_method(tmp_path):
    bad = tmp_path / "bench-bad.yaml"
    bad.write_text(yaml.safe_dump({"suite": "bad", "title": "t", "methods": [
        {"name": "m", "strategy": {"name": "mastery-gated"}, "sweep": {"alpha": [1.0], "tau": [0.5]}}]}))
    with pytest.raises(ConfigError, match=r"bench-bad.yaml: methods\[0\] \(m\): sweep: expected one strategy parameter"):
        load_suite(bad)
    bad.write_text(yaml.safe_dump({"suite": "bad", "title": "t", "methods": [
        {"name": "m", "strategy": {"name": "mastery-gated"}, "sweep": {"alhpa": [1.0]}}]}))
    with pytest.raises(ConfigError, match="(?s)bench-bad.yaml.*methods.0.strategy.*alhpa"):
        load_suite(bad)


def test_section_is_replaced_in_place_and_survives_the_matrix_writer(tmp_path):
    from taut.lab.bench.matrix import write_benchmarks_md

    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n<!-- discussion -->\nmine\n<!-- /discussion -->\n")
    write_section(md, "gate", "## Gate — not yet run")
    write_section(md, "gate", "## Gate\n\nnumbers")
    text = md.read_text()
    assert text.count("<!-- suite:gate -->") == 1 and "not yet run" not in text and "numbers" in text
    summary = {"start": _eval(), "rows": [], "command": "taut bench", "seconds": 60.0,
               "config": {"start_steps": 1, "steps": 1, "rl": {"prompts_per_step": 1, "group_size": 1},
                          "eval": {"n_per_level": 1, "samples": 1, "temperature": 1.0}}}
    write_benchmarks_md(md, summary, {})
    text = md.read_text()
    assert "mine" in text and "<!-- suite:gate -->\n## Gate\n\nnumbers\n<!-- /suite:gate -->" in text


def _eval(direct=0.4):
    cell = lambda acc, thinks: {"n_samples": 10, "accuracy": acc, "tokens_mean": 20.0, "coverage": 0.5, "thinks_rate": thinks}  # noqa: E731
    by_cell = {"add/1": cell(1.0, 0.5), "add/2": cell(0.8, 1 - direct), "search/1": cell(0.3, 0.0), "search/2": cell(0.5, 0.5)}
    summary = {"accuracy": 0.65, "tokens_mean": 20.0, "n_samples": 40, "redundancy": 0.2}
    return {"overall": summary, "in_domain": summary, "held_out": summary, "by_cell": by_cell,
            "by_domain": {"add": {"n_samples": 20, "accuracy": 0.9, "tokens_mean": 20.0},
                          "search": {"n_samples": 20, "accuracy": 0.4, "tokens_mean": 30.0}}}


def test_level_stats_count_direct_answers_only_where_steps_are_necessary():
    stats = level_stats(_eval(direct=0.4))
    # level 1: add's level 1 is a direct level (excluded); search has no direct level: 1 − 0 = 1
    assert stats["1"]["direct_where_necessary"] == pytest.approx(1.0)
    assert stats["2"]["direct_where_necessary"] == pytest.approx((0.4 + 0.5) / 2)
    assert stats["2"]["accuracy"] == pytest.approx(0.65)
    search = level_stats(_eval(), {"search"})
    assert search["1"]["accuracy"] == 0.3 and search["2"]["direct_where_necessary"] == pytest.approx(0.5)
    tables = suite_tables({"start": _eval(), "results": {"m/seed0": {"method": "m", "evals": {"final": _eval(0.2)}},
                                                         "m/seed1": {"method": "m", "evals": {"final": _eval(0.6)}}}})
    (row,) = tables["rows"]
    assert row["seeds"] == 2 and row["search_accuracy"] == pytest.approx(0.4)
    assert row["levels"]["2"]["direct_where_necessary"] == pytest.approx(0.45)


def _row(name, accuracy, search, n=1000):
    return {"method": name, "accuracy": sum(accuracy) / len(accuracy), "search_accuracy": sum(search) / len(search),
            "tokens": 30.0, "search_tokens": 50.0, "seed_values": {"accuracy": accuracy, "search_accuracy": search},
            "accuracy_se": math.sqrt(sum(p * (1 - p) / n for p in accuracy)) / len(accuracy),
            "search_accuracy_se": math.sqrt(sum(p * (1 - p) / n for p in search)) / len(search)}


def test_a_difference_counts_only_beyond_its_error_bar_with_the_seeds_apart():
    from taut.lab.bench.suite import compare

    rows = [_row("on", [0.90, 0.92], [0.60, 0.64]), _row("off", [0.89, 0.93], [0.40, 0.44]), _row("far", [0.70, 0.95], [0.1, 0.1])]
    c = compare(rows, "on", "off", "search_accuracy")
    assert c["difference"] == pytest.approx(0.20) and c["seeds_separated"] and c["counts"]
    se = math.sqrt(0.6 * 0.4 / 1000 + 0.64 * 0.36 / 1000) / 2, math.sqrt(0.4 * 0.6 / 1000 + 0.44 * 0.56 / 1000) / 2
    assert c["error_bar"] == pytest.approx(2 * math.sqrt(se[0] ** 2 + se[1] ** 2))
    same = compare(rows, "on", "off", "accuracy")                 # equal means, overlapping seeds
    assert same["difference"] == pytest.approx(0.0) and not same["counts"]
    overlap = compare(rows, "on", "far", "accuracy")              # a mean gap, but one seed of `far` beats `on`
    assert overlap["difference"] > overlap["error_bar"] and not overlap["seeds_separated"] and not overlap["counts"]
    assert compare(rows, "on", "missing", "accuracy") is None


def test_family_pairs_are_compared_value_by_value():
    from taut.lab.bench.suite import comparisons

    suite = load_suite(ROOT / "recipes" / "bench-gate.yaml")
    rows = [_row(f"gate-{side}@alpha={a}", [0.9, 0.9], [0.5, 0.5]) for side in ("on", "off") for a in (0.25, 1.0, 4.0)]
    rows += [_row("curriculum", [0.9, 0.9], [0.5, 0.5]), _row("curriculum (compressed)", [0.8, 0.8], [0.4, 0.4])]
    pairs = {(c["a"], c["b"]) for c in comparisons(suite, rows)}
    assert pairs == {(f"gate-on@alpha={a}", f"gate-off@alpha={a}") for a in (0.25, 1.0, 4.0)} | {("curriculum", "curriculum (compressed)")}


def test_compare_names_must_exist(tmp_path):
    bad = tmp_path / "bench-bad.yaml"
    bad.write_text(yaml.safe_dump({"suite": "bad", "title": "t", "compare": [["m", "gate-of"]],
                                   "methods": [{"name": "m", "strategy": {"name": "none"}}]}))
    with pytest.raises(ConfigError, match=r"compare\[0\]: no method or family 'gate-of'"):
        load_suite(bad)


def test_start_redundancy_by_kind_and_level(tmp_path):
    from taut.lab.bench.suite import start_redundancy

    path = tmp_path / "start.samples.jsonl"
    rows = [  # (domain, level, text, length incl. <eos>, redundant tokens, thinks)
        ("add", 1, "</think> answer 5", 4, 0, False),
        ("add", 1, "2 + 3 = 5 ; </think> answer 5 check 2 + 3 = 5 ok", 17, 13, True),   # 6 thinking + 7 rounds
        ("search", 1, "</think> answer 3", 4, 0, False),
    ]
    path.write_text("".join(json.dumps({"domain": d, "difficulty": lv, "text": t, "length": n, "redundant_tokens": r,
                                        "thinks": th, "truncated": False}) + "\n" for d, lv, t, n, r, th in rows))
    default = start_redundancy(path, exclude={"search"})
    assert default["1"] == pytest.approx({"redundancy": 13 / 21, "extra_thinking": 6 / 21, "rounds": 7 / 21, "direct": 0.5})
    assert start_redundancy(path)["all"]["direct"] == pytest.approx(2 / 3)
    assert start_redundancy(tmp_path / "none.jsonl") == {}


def test_the_suite_recipe_is_a_bench_recipe():
    from taut.lab.bench.suite import load_any_bench

    path = ROOT / "recipes" / "bench-gate.yaml"
    assert [m.name for m in load_any_bench(path).methods] == [m.name for m in load_suite(path).bench.methods]
    assert len(load_any_bench(path, quick=True).methods) < len(load_any_bench(path).methods)


def test_guess_stats_count_search_answers_without_steps(tmp_path):
    from taut.lab.bench.suite import guess_stats

    path = tmp_path / "eval.samples.jsonl"
    rows = [("search", False, True), ("search", False, False), ("search", False, False), ("search", True, True),
            ("add", False, True)]
    path.write_text("".join(json.dumps({"domain": d, "thinks": t, "correct": c}) + "\n" for d, t, c in rows))
    assert guess_stats(path, {"search"}) == {"guess_rate": 0.75, "guess_accuracy": pytest.approx(1 / 3)}
    assert guess_stats(tmp_path / "missing.jsonl", {"search"}) == {"guess_rate": None, "guess_accuracy": None}


@pytest.mark.slow
def test_gate_suite_quick_end_to_end(tmp_path, monkeypatch):
    """`taut bench --suite gate --quick` trains every quick method, then writes its tables, figure
    and BENCHMARKS.md section (slow: two to eight minutes, depending on the machine's load)."""
    from typer.testing import CliRunner

    from taut.cli import app

    monkeypatch.chdir(ROOT)                      # suites are found under recipes/
    out, md = tmp_path / "run", tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n<!-- discussion -->\nkept\n<!-- /discussion -->\n")
    result = CliRunner().invoke(app, ["bench", "--suite", "gate", "--quick", "--out", str(out), "--write", str(md)])
    assert result.exit_code == 0, result.output
    tables = json.loads((out / "suite.json").read_text())
    assert {r["method"] for r in tables["rows"]} == {"control", "gate-on@alpha=0.5", "gate-on@alpha=2.0",
                                                    "gate-off@alpha=0.5", "gate-off@alpha=2.0", "gate-on+sampler"}
    for row in tables["rows"]:
        assert set(row["search_levels"]) == {"1", "2", "3", "4"} and row["search_guess_rate"] is not None
    logged = [json.loads(line) for line in (out / "gate-off@alpha=0.5" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["gate_open"] == 1.0 for r in logged if "gate_open" in r)
    text = md.read_text()
    assert "kept" in text and "<!-- suite:gate -->" in text and "not yet run" not in text
    assert (tmp_path / "docs" / "figures" / "gate-pareto.png").exists()


def test_the_shipped_gate_model_answers_easy_problems_directly_and_thinks_on_hard_ones():
    """builtin:testbed-sft-gate is the SFT model of recipes/testbed-sft-gate.yaml: its choice to
    think depends on the problem (95 % direct answers on level 1 in its traces, 50 % above) and
    it writes post-answer rounds — the redundancy the gate study's start keeps."""
    from taut.config import RunConfig
    from taut.workflows import evaluate_policy, load_for_eval

    config = RunConfig.model_validate({"model": {"path": "builtin:testbed-sft-gate", "threads": 1},
                                       "data": {"eval": ["gym:train"]}, "eval": {"n_per_level": 12, "samples": 2}})
    policy, _ = load_for_eval(config, "builtin:testbed-sft-gate")
    by_level = evaluate_policy(config, policy, {})[0]["by_level"]
    assert by_level["1"]["thinks_rate"] < 0.25          # builtin:testbed-sft: 0.49
    assert by_level["4"]["thinks_rate"] > 0.35
    assert all(by_level[level]["rounds_rate"] > 0.8 for level in ("1", "2", "3", "4"))   # builtin:testbed-sft: 0.62–0.70

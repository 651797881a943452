"""reasoning-gym tasks: specs, levels, disjoint splits, the library's scorer on the extracted
answer (partial scores kept), errors; and a short curriculum run on a mixture of them with a
tiny chat model (train, validation, mastery sampler, per-level evaluation)."""

import json

import pytest

from taut.config import ConfigError, ReasoningGymTaskConfig, RunConfig, load_config
from taut.tasks import load_task

pytest.importorskip("reasoning_gym")

ARITHMETIC = {"task": "reasoning-gym:basic_arithmetic",
              "config": {"operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False},
              "levels": {1: {"min_terms": 2, "max_terms": 2, "max_digits": 1}, 2: {"min_terms": 3, "max_terms": 4, "max_digits": 2}}}


def _task(spec, levels=None):
    return load_task(ReasoningGymTaskConfig.model_validate(spec) if isinstance(spec, dict) else spec, levels)


def test_string_and_mapping_specs_validate_in_a_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  train:\n    - reasoning-gym:chain_sum\n"
                      "    - {task: reasoning-gym:leg_counting, levels: curriculum, held_out: true}\n")
    config = load_config(recipe)
    assert config.data.train[0] == "reasoning-gym:chain_sum"
    assert config.data.train[1] == ReasoningGymTaskConfig(task="reasoning-gym:leg_counting", levels="curriculum", held_out=True)
    recipe.write_text("data:\n  train:\n    - {task: reasoning-gym:chain_sum, levls: {1: {}}}\n")
    with pytest.raises(ConfigError, match=r"unknown key .data.train.0.levls. \(did you mean .data.train.0.levels.\?\); valid keys here: task, config, levels"):
        load_config(recipe)


def test_levels_map_to_configs_and_data_levels_filter_them():
    task = _task(ARITHMETIC)
    problems = task.problems("test", 20)
    by_level = {lv: [p for p in problems if p.difficulty == lv] for lv in (1, 2)}
    assert all(len(v) == 20 for v in by_level.values())
    terms = {lv: {p.prompt.split("\n")[0].count("+") + p.prompt.split("\n")[0].count("-") + 1 for p in v} for lv, v in by_level.items()}
    assert terms[1] == {2} and terms[2] <= {3, 4}
    assert {p.difficulty for p in _task(ARITHMETIC, levels=[2, 5]).problems("test", 5)} == {2}
    with pytest.raises(ValueError, match="none of data.levels"):
        _task(ARITHMETIC, levels=[7])


def test_the_library_curriculum_gives_the_levels():
    task = _task({"task": "reasoning-gym:chain_sum", "levels": "curriculum"}, levels=[1, 3])
    assert sorted(task.level_config) == [1, 3]
    assert task.level_config[1]["max_terms"] < task.level_config[3]["max_terms"]


def test_splits_never_overlap_and_problems_are_stable():
    task = _task(ARITHMETIC)
    splits = {s: task.problems(s, 60) for s in ("train", "validation", "test")}
    questions = {s: {p.prompt for p in ps} for s, ps in splits.items()}
    assert not questions["train"] & questions["test"]
    assert not questions["train"] & questions["validation"] and not questions["validation"] & questions["test"]
    ids = [p.id for ps in splits.values() for p in ps]
    assert len(ids) == len(set(ids))
    assert [p.id for p in task.problems("train", 60)] == [p.id for p in splits["train"]]
    assert [p.id for p in task.problems("train", 60, seed=1)] != [p.id for p in splits["train"]]


def test_prompt_states_the_answer_format_and_only_that_form_is_read():
    boxed = _task("reasoning-gym:chain_sum")
    p = boxed.problems("test", 1)[0]
    assert p.prompt.endswith("Put your final answer within \\boxed{}.")
    assert boxed.verify(p, f"The sum is \\boxed{{{p.answer}}}.", complete=True).correct
    assert not boxed.verify(p, f"Answer: {p.answer}", complete=True).correct                 # not the asked form
    assert not boxed.verify(p, f"<think>\\boxed{{{p.answer}}}", complete=False).correct       # still thinking
    assert not boxed.verify(p, f"\\boxed{{{p.answer}}} then \\boxed{{{p.answer}", complete=False).correct   # box still open

    tags = _task({"task": "reasoning-gym:knights_knaves", "answer_format": "answer-tags"})
    q = tags.problems("test", 1)[0]
    assert q.prompt.endswith("Give your final answer between <answer> and </answer>.")
    verdict = tags.verify(q, f"<think>who lies?</think><answer>{q.answer}</answer>", complete=True)
    assert verdict.correct and verdict.score == 1.0 and verdict.extracted == q.answer
    assert not tags.verify(q, f"<answer>{q.answer}", complete=False).correct


def test_partial_scores_are_kept_and_are_not_correct():
    task = _task("reasoning-gym:chain_sum")
    p = task.problems("test", 1)[0]
    verdict = task.verify(p, f"\\boxed{{x = {p.answer}}}", complete=True)   # the library gives partial credit
    assert 0 < verdict.score < 1 and not verdict.correct
    assert verdict.score == pytest.approx(len(p.answer) / len(f"x = {p.answer}"))


def test_a_failing_scorer_is_a_verifier_error(monkeypatch):
    task = _task("reasoning-gym:chain_sum")
    p = task.problems("test", 1)[0]

    def broken(answer, entry):
        raise KeyError("metadata")

    monkeypatch.setattr(task._scorers[1], "score_answer", broken)
    verdict = task.verify(p, "\\boxed{3}", complete=True)
    assert not verdict.correct and "scorer raised KeyError" in verdict.error


@pytest.mark.parametrize("spec, message", [
    ("reasoning-gym:chain_sun", "did you mean"),
    ({"task": "reasoning-gym:chain_sum", "config": {"max_termz": 3}}, "valid fields: allow_negation"),
    ({"task": "reasoning-gym:gsm_symbolic", "levels": "curriculum"}, "has no curriculum"),
    ({"task": "reasoning-gym:gsm_symbolic", "config": {"difficulty": 2.0}}, "rejects the config"),
])
def test_bad_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        _task(spec)


def test_missing_extra_names_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "reasoning_gym" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'taut\[gym\]'"):
        _task("reasoning-gym:chain_sum")


def test_curriculum_run_on_a_mixture_trains_validates_and_reports_per_level(tmp_path):
    from test_real_models import tiny_chat_model

    from taut.rl.trainer import train_rl
    from taut.workflows import evaluate_policy, load_for_eval

    model = tiny_chat_model(tmp_path / "model")
    tasks = ["reasoning-gym:chain_sum", ARITHMETIC]
    config = RunConfig.model_validate({
        "model": {"path": str(model), "threads": 1},
        "data": {"train": tasks, "eval": [*tasks, {"task": "reasoning-gym:leg_counting", "held_out": True}],
                 "pool_per_level": 8},
        "rl": {"prompts_per_step": 3, "group_size": 2, "max_new_tokens": 16, "lr": 1e-2, "dynamic_sampling": False,
               "checkpoint_every": 100},
        "validation": {"every": 1, "n_per_level": 2, "samples": 1},
        "phases": [{"name": "accuracy", "steps": 1, "strategy": {"name": "kimi"}},
                   {"name": "compression", "steps": 1, "strategy": {"name": "mastery-gated"},
                    "sampler": {"mastered_fraction": "adaptive"}}],
        "eval": {"n_per_level": 2, "samples": 1, "max_new_tokens": 16, "budgets": [8]},
    })
    run = tmp_path / "run"
    train_rl(config, run, quiet=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "accuracy" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(r["verifier_errors"] == 0 for r in steps)
    assert any("val_accuracy" in r for r in records)

    policy, _ = load_for_eval(config, run)
    result, samples = evaluate_policy(config, policy, {})
    assert set(result["by_cell"]) == {"chain_sum/1", "basic_arithmetic/1", "basic_arithmetic/2", "leg_counting/1"}
    assert result["held_out"]["n_samples"] == 2 and result["in_domain"]["n_samples"] == 6
    assert all(c["tokens_mean"] > 0 for c in result["by_cell"].values())

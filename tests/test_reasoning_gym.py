"""reasoning-gym tasks: specs, levels, disjoint splits, the library's scorer on the extracted
answer (no partial credit in rewards unless a task opts in), errors; and a short curriculum run
on a mixture of them with a tiny chat model (train, validation, mastery sampler, per-level
evaluation)."""

import json

import pytest

from taut.config import (
    ConfigError,
    ReasoningGymTaskConfig,
    RunConfig,
    load_config,
    to_yaml,
)
from taut.tasks import load_task
from taut.tasks.reasoning_gym import extract_answer

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
    assert verdict.correct and verdict.score is None and verdict.extracted == q.answer
    assert not tags.verify(q, f"<answer>{q.answer}", complete=False).correct


@pytest.mark.parametrize("response, expected", [
    ("Answer: 12", "12"),
    ("2 + 10 = 12\n**Answer:** 12.", "12"),
    ("**Answer**: `12`", "12"),
    ("answer: 3\nNo, recheck.\nANSWER: 5\n", "5"),                     # the last Answer: line
    ("Answer: -7.", "-7"),
    ("Answer: Yes, Alice is a knight", "Yes, Alice is a knight"),         # not only numbers
    ("3 + 4 = 7\nAnswer:", None),                                       # an empty answer line: no answer, no fallback
    ("3 + 4 = 7\nAnswer:\n7", None),                                    # the value must be on the Answer: line
    ("So 3 - 10 = -7", "-7"),                                            # no Answer: the last number
    ("Half of 5 is 2.5.", "2.5"),
    ("No numbers here.", None),
    ("<think>Answer: 3</think>The total is 4", "4"),                     # only after the last </think>
    ("<think>so 3</think>Answer: 4", "4"),
    ("<think>Answer: 3 and 5</think>", None),
    ("<think>Answer: 3", None),                                          # still thinking
])
def test_answer_line_reads_the_last_answer_line_else_the_last_number(response, expected):
    assert extract_answer(response, "answer-line", complete=True, fallback_last_number=True) == expected


def test_answer_line_without_the_fallback_and_when_cut():
    def line(response, fallback=False, complete=True):
        return extract_answer(response, "answer-line", complete=complete, fallback_last_number=fallback)

    assert line("So 3 - 10 = -7") is None and line("Answer: -7") == "-7"
    assert line("Answer: 4", fallback=True, complete=False) is None            # "4" may be the start of "42"
    assert line("Answer: 42\nCheck: 4", complete=False) == "42"               # a finished line counts
    assert line("Answer: 42\n", complete=False) == "42"
    assert line("Answer: 42", fallback=True, complete=True) == "42"


def test_answer_line_prompt_scores_with_the_library_and_the_instruction_overrides_it():
    spec = {**ARITHMETIC, "answer_format": "answer-line"}
    task = _task(spec)
    p = task.problems("test", 1)[0]
    default = "Give your final answer on a line of its own as 'Answer: <your answer>'."
    assert p.prompt.endswith(f"\n\n{default}")
    verdict = task.verify(p, f"Adding the terms gives {p.answer}.\n**Answer:** {p.answer}.", complete=True)
    assert verdict.correct and verdict.score is None and verdict.extracted == p.answer
    assert task.verify(p, f"The result is {p.answer}", complete=True).correct               # the fallback
    assert not _task({**spec, "fallback_last_number": False}).verify(p, f"The result is {p.answer}", complete=True).correct
    assert not task.verify(p, f"Answer: {p.answer}1", complete=True).correct

    instruction = "Think step by step, then give your final answer on its own line as 'Answer: <answer>'."
    q = _task({**spec, "instruction": f"  {instruction}\n"}).problems("test", 1)[0]
    assert q.id == p.id and q.prompt == p.prompt.replace(default, instruction)
    assert _task({**ARITHMETIC, "instruction": instruction}).problems("test", 1)[0].prompt == q.prompt   # any format


@pytest.mark.parametrize("fields, message", [
    ({"fallback_last_number": True}, "fallback_last_number applies to answer_format: answer-line only "
                                     r"\(this task reads boxed\); remove it or set answer_format: answer-line"),
    ({"answer_format": "answer-tags", "fallback_last_number": False}, "answer-line only"),
    ({"instruction": " \n"}, "instruction is empty: write the line the prompt should end with"),
    ({"answer_format": "answer_line"}, "'boxed', 'answer-tags' or 'answer-line'"),
])
def test_answer_format_settings_are_checked(tmp_path, fields, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"data:\n  train:\n    - {json.dumps({'task': 'reasoning-gym:chain_sum', **fields})}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(recipe)


def test_answer_format_settings_survive_a_written_config(tmp_path):
    tasks = [{"task": "reasoning-gym:chain_sum"}, {"task": "reasoning-gym:chain_sum", "answer_format": "answer-line"},
             {"task": "reasoning-gym:chain_sum", "answer_format": "answer-line", "fallback_last_number": False,
              "instruction": "Answer with 'Answer: N'."}]
    config = RunConfig.model_validate({"data": {"train": tasks}})
    (tmp_path / "config.yaml").write_text(to_yaml(config))
    read = load_config(tmp_path / "config.yaml")
    assert read.data.train == config.data.train
    assert [t.reads_last_number for t in read.data.train] == [False, True, False]


class _Scripted:
    """A policy and a rollout engine in one: every prompt gets the scripted texts as its group."""

    def __init__(self, texts):
        self.texts = texts

    def encode_prompt(self, text):
        return [0]

    def decode(self, ids):
        return self.texts[ids[0]]

    def generate(self, prompts, n, params, generator=None, **_):
        from taut.rollout import Rollouts

        return Rollouts(prompt_index=[0] * n, tokens=[[i] for i in range(n)], truncated=[False] * n)


def _rewards(task, problem, texts):
    """The shaped rewards and sampled scores the RL loop gives a group of these responses."""
    import numpy as np

    from taut.config import RLConfig
    from taut.length import NoneConfig, build_strategy
    from taut.rl.objectives import build_objective
    from taut.rl.rollouts import collect

    cfg = RLConfig(prompts_per_step=1, group_size=len(texts), max_sampling_rounds=1, dynamic_sampling=False)
    strategy = build_strategy(NoneConfig())
    scripted = _Scripted(texts)
    out = collect(scripted, scripted, lambda n: [(task, problem)], strategy, build_objective(strategy, cfg.loss).informative,
                  cfg.sampling, step=0, cap=64, generator=None, np_rng=np.random.default_rng(0))
    return out.rewards[0].tolist(), out.sampled["score"]


def test_an_answer_that_only_contains_the_right_one_earns_no_reward():
    # the library's scorer gives partial credit to an answer that contains the right one ("17" for
    # "7" scores 0.5); a reward that paid it would pay for writing more than the answer
    task = _task("reasoning-gym:chain_sum")
    p = task.problems("test", 1)[0]
    texts = [f"\\boxed{{{p.answer}}}", f"\\boxed{{1{p.answer}}}", f"\\boxed{{x = {p.answer}}}", "\\boxed{?}"]
    library = [task._scorers[1].score_answer(t[7:-1], p.data.item) for t in texts]
    assert library[0] == 1.0 and all(0 < s < 1 for s in library[1:3]) and library[3] == 0.0
    verdicts = [task.verify(p, t, complete=True) for t in texts]
    assert [v.correct for v in verdicts] == [True, False, False, False]
    assert all(v.score is None for v in verdicts)                  # no partial credit: the grade is correctness
    assert _rewards(task, p, texts) == ([1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0])


def test_partial_credit_is_kept_only_where_a_task_opts_in():
    from taut.tasks.reasoning_gym import ReasoningGymTask

    task = ReasoningGymTask(ReasoningGymTaskConfig(task="reasoning-gym:chain_sum"), partial_credit=True)
    p = task.problems("test", 1)[0]
    verdict = task.verify(p, f"\\boxed{{x = {p.answer}}}", complete=True)
    assert 0 < verdict.score < 1 and not verdict.correct
    assert verdict.score == pytest.approx(len(p.answer) / len(f"x = {p.answer}"))
    texts = [f"\\boxed{{{p.answer}}}", f"\\boxed{{x = {p.answer}}}"]
    assert _rewards(task, p, texts)[0] == pytest.approx([1.0, verdict.score])
    # a recipe opts in with the task's `partial_credit: true`
    from taut.tasks import load_task

    recipe = load_task(ReasoningGymTaskConfig(task="reasoning-gym:chain_sum", partial_credit=True))
    plain = load_task("reasoning-gym:chain_sum")
    assert recipe.partial_credit and not plain.partial_credit


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


def test_a_misspelt_task_is_caught_by_dry_run_with_readable_suggestions():
    from typer.testing import CliRunner

    from taut.cli import app

    result = CliRunner().invoke(app, ["train", "--config", "builtin:grpo", "--set", "data.train=[reasoning-gym:chain_sun]",
                                      "--dry-run"])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "unknown reasoning-gym task 'chain_sun' (did you mean chain_sum" in line and "['" not in line


def test_without_the_extra_dry_run_fails_with_one_line(monkeypatch):
    import importlib.util

    from typer.testing import CliRunner

    from taut.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "reasoning_gym" else real(name, *a))
    result = CliRunner().invoke(app, ["train", "--config", "builtin:real/siri-smollm2-gym", "--dry-run"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "needs the 'reasoning_gym' package: pip install 'taut[gym]'" in lines[0], result.output


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

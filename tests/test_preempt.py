"""SIGTERM and SIGUSR1 (batch schedulers): the step finishes, its checkpoint is written, one line
says how to continue, exit code 4; resuming gives the weights of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from taut.checkpoint import list_checkpoints

SRC = str(Path(__file__).resolve().parent.parent / "src")
ENV = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "300"}
MICRO = ["--config", "default", "--set", "model.preset=tiny", "--set", "model.path=null", "--set", "model.threads=1",
         "--set", "rl.prompts_per_step=4", "--set", "rl.group_size=4", "--set", "rl.max_new_tokens=12",
         "--set", "rl.checkpoint_every=1000", "--set", "rl.dynamic_sampling=false", "--set", "data.pool_per_level=5",
         "--set", "rl.steps=12"]
SFT = """
seed: 0
model: {preset: tiny, threads: 1}
data: {sft: ["gym:add"]}
sft: {steps: 40, batch_size: 4, bucket_batches: 1, warmup_steps: 0, log_every: 4, checkpoint_every: 1000}
"""


def _taut(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "taut.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)


def _interrupt(proc: subprocess.Popen, metrics: Path, lines: int, signum: int) -> tuple[int, str]:
    """Send `signum` once `metrics` has `lines` lines; the exit code and stderr."""
    deadline = time.time() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= lines):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.time() < deadline, "the run logged too little within 180 s"
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=180)
    return proc.returncode, err


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_stops_rl_at_a_step_with_its_checkpoint_and_resume_matches_an_uninterrupted_run(tmp_path):
    stopped, clean = tmp_path / "stopped", tmp_path / "clean"
    code, err = _interrupt(_taut("train", *MICRO, "--out", str(stopped), "--quiet"), stopped / "metrics.jsonl", 3,
                           signal.SIGTERM)
    assert code == 4, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("stopped by SIGTERM after step "), err
    step = int(lines[0].split("after step ")[1].split(",")[0])
    assert 2 <= step < 12, "the run finished before the signal"
    assert lines[0].endswith(f"continue with: taut train --resume {stopped}")
    assert [p.name for p in list_checkpoints(stopped)][-1] == f"step-{step:06d}"      # written at the stop

    resumed = _taut("train", "--resume", str(stopped), "--quiet")
    assert resumed.wait() == 0, resumed.communicate()[1]
    assert _taut("train", *MICRO, "--out", str(clean), "--quiet").wait() == 0
    records = [json.loads(line) for line in (stopped / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "event" not in r] == list(range(1, 13)), "each step logged exactly once"
    assert _same(_weights(stopped / "checkpoints" / "step-000012"), _weights(clean / "checkpoints" / "step-000012"))


def test_sigusr1_stops_sft_with_the_command_that_continues_it(tmp_path):
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(SFT)
    stopped = tmp_path / "stopped"
    code, err = _interrupt(_taut("sft", "--config", str(recipe), "--out", str(stopped), "--quiet"),
                           stopped / "metrics.jsonl", 1, signal.SIGUSR1)
    assert code == 4 and "stopped by SIGUSR1 after step " in err and f"continue with: taut sft --resume {stopped}" in err, err
    step = int(err.split("after step ")[1].split(",")[0])
    assert [p.name for p in list_checkpoints(stopped)] == [f"step-{step:06d}"]


def test_sft_stopped_between_two_metrics_lines_resumes_to_the_same_weights_and_lines(tmp_path, monkeypatch):
    import yaml

    import taut.sft as sft
    from taut.config import RunConfig
    from taut.preempt import Preempted, StopRequest

    config = RunConfig.model_validate(yaml.safe_load(SFT))
    clean = sft.train_sft(config, tmp_path / "clean", quiet=True)
    stop, calls, encode = StopRequest(), [], sft.encode_batch

    def encode_and_signal(*args, **kwargs):          # the signal arrives during step 6 (log_every: 4)
        calls.append(1)
        if len(calls) == 6:
            stop.signal_name = "SIGUSR1"
        return encode(*args, **kwargs)

    monkeypatch.setattr(sft, "encode_batch", encode_and_signal)
    stopped = tmp_path / "stopped"
    try:
        sft.train_sft(config, stopped, quiet=True, stop=stop)
        raise AssertionError("not stopped")
    except Preempted as err:
        assert err.step == 6 and err.checkpoint.name == "step-000006"
    monkeypatch.undo()
    final = sft.train_sft(config, stopped, resume=True, quiet=True)
    assert _same(_weights(final), _weights(clean))
    losses = lambda run: [(r["step"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]  # noqa: E731
    assert losses(stopped) == losses(tmp_path / "clean")        # the line at step 8 covers steps 5-8 in both


def test_a_second_signal_stops_at_once():
    code = textwrap.dedent("""
        import os, signal, time
        from taut.preempt import stop_on_signals
        with stop_on_signals() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.signal_name == "SIGTERM"
            print("first handled", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.stdout == "first handled\n" and proc.returncode == -signal.SIGTERM, proc.stderr


def test_handlers_are_restored_after_the_block():
    from taut.preempt import stop_on_signals

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    with stop_on_signals():
        assert signal.getsignal(signal.SIGTERM) not in before[:1]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == before


def test_a_killed_sft_loses_at_most_checkpoint_minutes_and_a_finished_run_keeps_only_its_step_checkpoints(
        tmp_path, kill_with_timed_checkpoints):
    import yaml

    import taut.sft as sft
    from taut.config import RunConfig

    config = RunConfig.model_validate(yaml.safe_load(SFT))
    config.sft.steps, config.sft.checkpoint_every = 10, 4
    clean = sft.train_sft(config.model_copy(update={"sft": config.sft.model_copy(update={"checkpoint_minutes": None})}),
                          tmp_path / "clean", quiet=True)
    timed = tmp_path / "timed"
    seen, restore = kill_with_timed_checkpoints(sft, "encode_batch", 8, timed)     # killed during step 8
    with pytest.raises(KeyboardInterrupt):
        sft.train_sft(config, timed, quiet=True)
    assert seen[5] == ["step-000004", "step-000005"]             # each step timed; the newest timed one only
    assert seen[7] == ["step-000004", "step-000007"]             # the kill loses step 8 alone
    restore()
    final = sft.train_sft(config, timed, resume=True, quiet=True)
    assert [p.name for p in list_checkpoints(timed)] == [p.name for p in list_checkpoints(tmp_path / "clean")] \
        == ["step-000004", "step-000008", "step-000010"]
    assert _same(_weights(final), _weights(clean))

"""Progress output: plain lines without a terminal (nohup, batch schedulers), the rich bar on one."""

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from taut import runlog
from taut.runlog import StepProgress

SRC = Path(__file__).resolve().parent.parent / "src"

LOOP = """
from taut.runlog import StepProgress
with StepProgress(4, "rl accuracy→compression", quiet={quiet}) as bar:
    for step in range(1, 5):
        bar.update(step, reward=0.5, acc=0.625, len=38.25, cap=128 - 8 * step,
                   phase="accuracy" if step < 3 else "compression")
print("result line")
"""


def run_loop(quiet=False, seconds="0"):
    env = {**os.environ, "PYTHONPATH": str(SRC), "TAUT_PROGRESS_SECONDS": seconds}
    env.pop("FORCE_COLOR", None)
    env.pop("TTY_COMPATIBLE", None)
    return subprocess.run([sys.executable, "-c", LOOP.format(quiet=quiet)], capture_output=True, text=True, env=env,
                          timeout=60, check=True)


def test_without_a_terminal_each_update_prints_a_plain_line_to_stderr():
    proc = run_loop()
    lines = proc.stderr.splitlines()
    assert len(lines) == 4, proc.stderr
    assert lines[0].startswith("rl accuracy→compression step 1/4  reward 0.5  acc 0.625  len 38.2  cap 120  "
                               "phase accuracy  ")
    assert "step 4/4" in lines[3] and "cap 96" in lines[3] and "phase compression" in lines[3]
    assert all("steps/s  ETA " in line for line in lines)
    assert "\x1b[" not in proc.stderr                      # no terminal codes in a log file
    assert proc.stdout == "result line\n"


def test_without_a_terminal_lines_are_spaced_in_time_but_the_first_and_last_always_print():
    lines = run_loop(seconds="3600").stderr.splitlines()
    assert [line.split("  ")[0] for line in lines] == ["rl accuracy→compression step 1/4", "rl accuracy→compression step 4/4"]


def test_quiet_silences_progress_but_not_results():
    proc = run_loop(quiet=True)
    assert proc.stderr == "" and proc.stdout == "result line\n"


def test_on_a_terminal_the_bar_shows_cap_and_phase_as_text(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(runlog, "console", Console(file=out, force_terminal=True, width=160))
    with StepProgress(10, "rl", start=0) as bar:
        bar.update(3, reward=0.5, cap=112, phase="compression")
    text = out.getvalue()
    assert "cap 112" in text and "phase compression" in text and "3/10" in text


def test_eta_and_rate_in_the_plain_line():
    bar = StepProgress(100, "sft", quiet=True, start=10)
    line = bar.line(20, {"loss": 1.23456, "phase": None}, elapsed=5.0)
    assert line == "sft step 20/100  loss 1.23  2 steps/s  ETA 40s"


def test_a_training_run_without_a_terminal_prints_progress_and_ends_with_its_outputs_and_next_command(tmp_path):
    run = tmp_path / "run"
    micro = ["--set", "model.preset=tiny", "--set", "model.path=null", "--set", "model.threads=1", "--set", "rl.steps=2",
             "--set", "rl.prompts_per_step=2", "--set", "rl.group_size=2", "--set", "rl.max_new_tokens=8",
             "--set", "data.pool_per_level=2"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "TAUT_PROGRESS_SECONDS": "0", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "taut.cli", "train", "--config", "default", *micro, "--out", str(run)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    progress = [line for line in proc.stderr.splitlines() if line.startswith("rl main step")]
    assert [line.split("  ")[0] for line in progress] == ["rl main step 1/2", "rl main step 2/2"]
    assert all(" len " in line and "steps/s  ETA " in line for line in progress)
    assert f"run: {run}" in proc.stdout and f"next: taut eval {run} --with-start" in proc.stdout


def test_eval_progress_names_the_checkpoint_and_the_task(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC), "TAUT_PROGRESS_SECONDS": "0", "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "taut.cli", "eval", "builtin:testbed-sft", "--tasks", "gym:add,gym:parity",
                           "--set", "eval.n_per_level=1", "--set", "eval.batch_size=4", "--out", str(tmp_path / "e.json")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    progress = [line for line in proc.stderr.splitlines() if line.startswith("eval ")]
    assert progress and all(line.startswith("eval testbed-sft problem ") for line in progress), proc.stderr
    assert "task gym:add" in progress[0] and "task gym:parity" in progress[-1]


def test_the_gguf_readers_bar_is_off_without_a_terminal(capsys):
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from taut.models.gguf import gguf_progress_on_terminals_only

    list(gguf_utils.tqdm(range(3), desc="Converting"))                 # the library's bar, even into a pipe
    assert "Converting" in capsys.readouterr().err
    with gguf_progress_on_terminals_only():
        list(gguf_utils.tqdm(range(3), desc="Converting"))
    assert "Converting" not in capsys.readouterr().err
    assert not isinstance(gguf_utils.tqdm, __import__("functools").partial)      # put back

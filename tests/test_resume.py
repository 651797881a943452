"""Checkpoints are atomic, and a run killed with SIGKILL completes with --resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from taut.checkpoint import list_checkpoints, read_state, save_checkpoint

MICRO = ["--config", "default", "--set", "model.preset=tiny", "--set", "model.path=null", "--set", "model.threads=1",
         "--set", "rl.prompts_per_step=4", "--set", "rl.group_size=4", "--set", "rl.max_new_tokens=12",
         "--set", "rl.checkpoint_every=2", "--set", "rl.dynamic_sampling=false", "--set", "data.pool_per_level=5"]


def _taut(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "taut.cli", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def _assert_complete(checkpoint: Path):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(checkpoint)
    load_file(str(checkpoint / "optimizer.safetensors"))
    assert read_state(checkpoint)["step"] == int(checkpoint.name.removeprefix("step-"))


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    steps = ["--set", "rl.steps=10"]
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    proc = _taut("train", *MICRO, *steps, "--out", str(killed), "--quiet")
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step-000004").exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline, "no checkpoint within 120 s"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reached = [p.name for p in list_checkpoints(killed)]
    assert "step-000010" not in reached, "the run finished before it could be killed"
    for checkpoint in list_checkpoints(killed):        # whatever was on disk at the kill is complete
        _assert_complete(checkpoint)

    assert _taut("train", "--resume", str(killed), "--quiet").wait() == 0
    assert _taut("train", *MICRO, *steps, "--out", str(clean), "--quiet").wait() == 0

    records = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "event" not in r] == list(range(1, 11)), "each step is logged exactly once"
    assert [r["step"] for r in records if r.get("event") == "phase-start"] == [0]
    a = load_file(str(killed / "checkpoints" / "step-000010" / "model.safetensors"))
    b = load_file(str(clean / "checkpoints" / "step-000010" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed run diverged from the uninterrupted one"
    assert not any(p.name.startswith(".tmp") for p in (killed / "checkpoints").iterdir())


def test_a_crash_while_writing_leaves_no_step_directory(tmp_path, tiny_policy, monkeypatch):
    """A disk that fills during a checkpoint write: safetensors' error becomes the OSError it is
    (one line from the CLI), and nothing of the unfinished checkpoint stays on the full disk."""
    import errno

    from safetensors import SafetensorError

    import taut.checkpoint as ck

    def crash(*args, **kwargs):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(ck, "_save_optimizer", crash)
    optimizer = torch.optim.AdamW(tiny_policy.model.parameters())
    with pytest.raises(OSError) as raised:
        save_checkpoint(tmp_path, 7, tiny_policy, {"kind": "rl"}, optimizer)
    assert raised.value.errno == errno.ENOSPC and ".tmp-step-000007" in raised.value.filename
    from taut.cli import failure

    assert failure(raised.value)[1].endswith("no space left on the device: free space, or write the run elsewhere with --out")
    assert list_checkpoints(tmp_path) == []
    assert list((tmp_path / "checkpoints").iterdir()) == []
    monkeypatch.undo()
    path = save_checkpoint(tmp_path, 7, tiny_policy, {"kind": "rl"}, optimizer)
    _assert_complete(path)


CURRICULUM = """
seed: 0
model: {preset: tiny, threads: 1}
data: {train: ["gym:add"], levels: [1], pool_per_level: 12}
rl: {prompts_per_step: 3, group_size: 4, max_new_tokens: 8, checkpoint_every: 5, dynamic_sampling: false, lr: 0.003}
validation: {every: 3, n_per_level: 6, samples: 1}
phases:
  - {name: accuracy, steps: 4, stop: {entropy_ratio: 0.5, window: 1}}
  - {name: compression, steps: 5, strategy: {name: mastery-gated}, sampler: {mastered_fraction: adaptive}}
  - {name: recovery, steps: 3}
selection: {criterion: shortest-within, reference: best}
"""
TIMINGS = {"step_time", "gen_time", "update_time", "reward_time", "rollout_tokens_per_s", "logprob_time"}


def _run_record(run_dir: Path):
    """Everything a run leaves that must not depend on whether it was interrupted."""
    metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMINGS}
               for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    weights = {p.name: load_file(str(p / "model.safetensors")) for p in list_checkpoints(run_dir)}
    return metrics, json.loads((run_dir / "curriculum.json").read_text()), weights


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The curriculum recipe and its uninterrupted run."""
    from taut.config import load_config
    from taut.rl.trainer import train_rl

    root = tmp_path_factory.mktemp("curriculum")
    recipe = root / "curriculum.yaml"
    recipe.write_text(CURRICULUM)
    train_rl(load_config(recipe), root / "clean", quiet=True)
    return recipe, _run_record(root / "clean")


@pytest.mark.parametrize("failpoint", [
    "phase-start@0",          # the first phase's start line written, its checkpoint not yet
    "step-logged@3",          # a validated step: candidate and line written, checkpoint not yet
    "checkpoint-write@3",     # inside that checkpoint's write, before the rename
    "phase-end@4",            # the phase ended (detectors, record), its checkpoint not yet
    "checkpoint-write@5",     # inside a periodic checkpoint (every 5) that is not a validation step
    "step-logged@7",          # an uncommitted step in the middle of a phase
    "phase-end@12",           # the end of the run, before selection.json
])
def test_curriculum_killed_anywhere_resumes_to_the_uninterrupted_run(tmp_path, uninterrupted, failpoint):
    from taut.config import load_config
    from taut.rl.trainer import train_rl

    recipe, (metrics_a, curriculum_a, weights_a) = uninterrupted
    killed = tmp_path / "killed"
    proc = _taut("train", "--config", str(recipe), "--out", str(killed), "--quiet",
                 env={**os.environ, "TAUT_FAILPOINT": failpoint})
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read().decode()
    train_rl(load_config(recipe), killed, resume=True, quiet=True)

    metrics_b, curriculum_b, weights_b = _run_record(killed)
    assert metrics_b == metrics_a, "metrics lines differ from the uninterrupted run"
    assert curriculum_b == curriculum_a, "curriculum.json (candidates, phases, selection) differs"
    assert curriculum_a["candidates"] and curriculum_a["selection"] is not None
    assert weights_b.keys() == weights_a.keys()
    for name in weights_a:
        assert all(torch.equal(weights_a[name][k], weights_b[name][k]) for k in weights_a[name]), name
    assert not any(p.name.startswith(".tmp") for p in (killed / "checkpoints").iterdir())


def test_a_killed_rl_run_loses_at_most_checkpoint_minutes_and_ends_with_the_checkpoints_of_a_run_without_them(
        tmp_path, kill_with_timed_checkpoints):
    """rl.checkpoint_minutes: a checkpoint once that much time has passed; the next replaces it, and
    keep_checkpoints counts only the step checkpoints."""
    import taut.rl.trainer as trainer
    from taut.config import load_config

    sets = [a for a in MICRO[2:] if a != "--set"] + ["rl.steps=10", "rl.checkpoint_every=4", "rl.keep_checkpoints=1"]
    config = load_config(None, sets)
    clean = tmp_path / "clean"
    trainer.train_rl(load_config(None, sets + ["rl.checkpoint_minutes=null"]), clean, quiet=True)
    timed = tmp_path / "timed"
    seen, restore = kill_with_timed_checkpoints(trainer, "collect", 7, timed)     # killed during step 7
    with pytest.raises(KeyboardInterrupt):
        trainer.train_rl(config, timed, quiet=True)
    assert seen[5] == ["step-000000", "step-000004", "step-000005"]    # each step timed; the newest timed one only
    assert seen[6] == ["step-000000", "step-000004", "step-000006"]    # the kill loses step 7 alone
    restore()
    trainer.train_rl(config, timed, resume=True, quiet=True)
    assert [p.name for p in list_checkpoints(timed)] == [p.name for p in list_checkpoints(clean)] \
        == ["step-000000", "step-000008", "step-000010"]
    records = [json.loads(line) for line in (timed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "event" not in r] == list(range(1, 11))
    a = load_file(str(timed / "checkpoints" / "step-000010" / "model.safetensors"))
    b = load_file(str(clean / "checkpoints" / "step-000010" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

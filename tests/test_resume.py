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

MICRO = ["--set", "model.preset=tiny", "--set", "model.path=null", "--set", "model.threads=1",
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
    import taut.checkpoint as ck

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "_save_optimizer", crash)
    optimizer = torch.optim.AdamW(tiny_policy.model.parameters())
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 7, tiny_policy, {"kind": "rl"}, optimizer)
    assert list_checkpoints(tmp_path) == []
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [f".tmp-step-000007-{os.getpid()}"]
    monkeypatch.undo()
    path = save_checkpoint(tmp_path, 7, tiny_policy, {"kind": "rl"}, optimizer)
    _assert_complete(path)

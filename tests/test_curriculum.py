"""The curriculum: a forced collapse stops the phase and rolls back; state survives --resume."""

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

from taut.config import RunConfig, SamplerConfig, SelectionConfig, load_config
from taut.curriculum import Candidate, CollapseDetectors, MasteryTracker, draw_mixture, mixture_share, select
from taut.rl.trainer import train_rl

import toytask  # noqa: F401  (registers the toy:… task)


def _base(**rl):
    return {
        "seed": 0, "model": {"preset": "tiny", "threads": 1},
        "data": {"train": ["toy:first-ok"], "pool_per_level": 40},
        "rl": {"prompts_per_step": 8, "group_size": 8, "max_new_tokens": 4, "lr": 3e-3, "dynamic_sampling": False,
               "checkpoint_every": 100, **rl},
        "validation": {"every": 2, "n_per_level": 40, "samples": 2},
    }


def test_forced_collapse_stops_early_and_rolls_back_to_the_pre_collapse_checkpoint(tmp_path):
    """A compression phase with an absurd learning rate collapses the shipped SFT model; the
    accuracy detector ends the phase and the run rolls back to the best validated checkpoint."""
    config = RunConfig.model_validate({
        "seed": 0, "model": {"path": os.environ.get("TAUT_TEST_MODEL", "builtin:testbed-sft"), "threads": 1},
        "data": {"train": ["gym:add"], "levels": [1, 2], "pool_per_level": 30},
        "rl": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 40, "checkpoint_every": 100},
        "validation": {"every": 1, "n_per_level": 20, "samples": 2},
        "phases": [
            {"name": "steady", "steps": 2},
            {"name": "collapse", "steps": 10, "lr": 0.004, "strategy": {"name": "mastery-gated"},
             "stop": {"accuracy_drop": 0.15}, "rollback": {"criterion": "best-accuracy"}},
            {"name": "after", "steps": 1},
        ],
    })
    import taut.rl.trainer
    from taut.checkpoint import run_finished

    written = []                   # curriculum.json after each phase says the run has not finished; the last says it has
    real = taut.rl.trainer.write_json_atomic

    def spy(path, data):
        if Path(path).name == "curriculum.json":
            written.append(data["finished"])
        real(path, data)

    taut.rl.trainer.write_json_atomic = spy
    try:
        train_rl(config, tmp_path, quiet=True)
    finally:
        taut.rl.trainer.write_json_atomic = real
    assert written[-1] is True and not any(written[:-1]) and len(written) >= 3 and run_finished(tmp_path)
    record = json.loads((tmp_path / "curriculum.json").read_text())
    steady, collapse, after = record["phases"]
    assert steady["ended_by"] == "steps" and steady["end_step"] == 2
    assert collapse["ended_by"] == "accuracy", collapse
    assert collapse["end_step"] < 2 + 10, "the phase must end before its planned steps"
    candidates = [c for c in record["candidates"] if c["phase"] == "collapse"]
    best = max(candidates, key=lambda c: (c["accuracy"], -c["tokens"], c["step"]))
    assert collapse["rolled_back_to"] == best["checkpoint"]
    assert best["step"] < collapse["end_step"]
    # the next phase starts from the rolled-back weights, and validates like them
    boundary = load_file(str(tmp_path / "checkpoints" / f"step-{collapse['end_step']:06d}" / "model.safetensors"))
    chosen = load_file(str(tmp_path / "checkpoints" / best["checkpoint"] / "model.safetensors"))
    assert all(torch.equal(boundary[k], chosen[k]) for k in chosen)
    after_start = next(c for c in record["candidates"] if c["phase"] == "after")
    assert after_start["accuracy"] == best["accuracy"]
    events = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    stop = [e for e in events if e.get("event") == "early-stop"]
    assert len(stop) == 1 and stop[0]["detector"] == "accuracy" and "validation accuracy" in stop[0]["why"]
    assert (tmp_path / "selection.json").exists()


def test_detectors_and_selection_rules_exact():
    from taut.config import StopRules

    d = CollapseDetectors(StopRules(accuracy_drop=0.1, patience=2), start_accuracy=0.8)
    assert d.observe_validation(2, 0.75) is None
    assert d.observe_validation(4, 0.65) is None          # first strike
    assert d.observe_validation(6, 0.85) is None          # reset
    assert d.observe_validation(8, 0.6) is None
    trip = d.observe_validation(10, 0.6)
    assert trip.detector == "accuracy" and trip.step == 10
    g = CollapseDetectors(StopRules(grad_norm_spike=5, window=3), None)
    assert all(g.observe_step(s, None, 1.0) is None for s in range(3))
    assert g.observe_step(3, None, 4.0) is None
    assert g.observe_step(4, None, 6.0).detector == "grad_norm"
    e = CollapseDetectors(StopRules(entropy_ratio=0.5, window=2), None)
    assert [e.observe_step(s, h, None) for s, h in enumerate([1.0, 1.0, 0.6])] == [None, None, None]
    assert e.observe_step(3, 0.3, None).detector == "entropy"    # mean(0.6, 0.3) < 0.5 × 1.0

    cands = [Candidate(0, "a", "p", 0.80, 50), Candidate(2, "b", "p", 0.79, 30), Candidate(4, "c", "p", 0.70, 20),
             Candidate(6, "d", "p", 0.81, 45)]
    assert select(cands, SelectionConfig(criterion="shortest-within", tolerance=0.02), 0.80).checkpoint == "b"
    assert select(cands, SelectionConfig(criterion="best-accuracy"), 0.80).checkpoint == "d"
    assert select(cands, SelectionConfig(criterion="last-good", tolerance=0.0), 0.80).checkpoint == "d"
    assert select(cands, SelectionConfig(criterion="last"), 0.80).checkpoint == "d"
    assert select(cands, SelectionConfig(criterion="shortest-within", tolerance=0.11, reference="best"), 0.5).checkpoint == "c"
    assert select(cands, SelectionConfig(criterion="shortest-within", tolerance=0.1, reference="best"), 0.5).checkpoint == "b"


def test_mixture_sampler_rule():
    import numpy as np

    assert mixture_share(SamplerConfig(mastered_fraction=0.25), 0.9) == 0.25
    assert mixture_share(SamplerConfig(mastered_fraction="adaptive"), 0.1) == 0.25
    assert mixture_share(SamplerConfig(mastered_fraction="adaptive"), 0.6) == 0.6
    assert mixture_share(SamplerConfig(mastered_fraction="adaptive"), 0.95) == 0.75
    mastered = [i % 3 == 0 for i in range(30)]                # 10 mastered, 20 not
    picked = draw_mixture([str(i) for i in range(30)], mastered, 8, 0.5, np.random.default_rng(0))
    assert len(set(picked)) == 8 and sum(mastered[i] for i in picked) == 4
    picked = draw_mixture([str(i) for i in range(30)], mastered, 25, 0.1, np.random.default_rng(0))
    assert len(set(picked)) == 25 and sum(mastered[i] for i in picked) == 5   # topped up: only 20 unmastered
    t = MasteryTracker(keep=2)
    for step, rate in enumerate([0.5, 1.0, 1.0]):
        t.record("x", step, rate)
    assert t.history["x"] == [(1, 1.0), (2, 1.0)] and t.mastered("x", 1.0)
    u = MasteryTracker()
    u.load_state_dict(json.loads(json.dumps(t.state_dict())))
    assert u.history == t.history


def test_mastered_frac_counts_at_the_samplers_threshold():
    """`mastered_frac` is the share of the pool the sampler treats as mastered: at its
    `mastery_threshold`, not at 1.0."""
    from types import SimpleNamespace

    from taut.config import PhaseConfig
    from taut.rl.rollouts import RolloutBatch
    from taut.rl.trainer import step_record

    tracker = MasteryTracker()
    for i, rate in enumerate([1.0, 0.75, 0.75, 0.25]):
        tracker.record(f"p{i}", 0, rate)
    pool = SimpleNamespace(items=[(None, SimpleNamespace(id=f"p{i}")) for i in range(4)])
    run = SimpleNamespace(step=1, tracker=tracker, pool=pool)
    batch = RolloutBatch(sampled={"correct": [True], "score": [1.0], "length": [3], "truncated": [False],
                                  "redundancy": [], "thinks": []})
    for threshold, share in ((1.0, 0.25), (0.75, 0.75), (0.2, 1.0)):
        phase = PhaseConfig.model_validate({"name": "compress", "steps": 1, "sampler": {"mastered_fraction": "adaptive",
                                                                                      "mastery_threshold": threshold}})
        assert step_record(run, phase, batch, {}, {}, cap=8, lr=1e-3)["mastered_frac"] == share


def test_mastery_history_and_sampler_state_survive_resume(tmp_path):
    recipe = tmp_path / "r.yaml"
    import yaml

    recipe.write_text(yaml.safe_dump({
        "seed": 0, "model": {"path": os.environ.get("TAUT_TEST_MODEL", "builtin:testbed-sft"), "threads": 1},
        "data": {"train": ["gym:add"], "levels": [1, 2], "pool_per_level": 20},
        "rl": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 40, "checkpoint_every": 2},
        "phases": [
        {"name": "acc", "steps": 4},
        {"name": "mix", "steps": 8, "sampler": {"mastered_fraction": "adaptive"},
         "strategy": {"name": "mastery-gated", "use_best_seen": True}},
    ]}))
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    taut = [sys.executable, "-m", "taut.cli", "train", "--quiet"]
    proc = subprocess.Popen([*taut, "--config", str(recipe), "--out", str(killed)], stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step-000008").exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "checkpoints" / "step-000012").exists()
    assert subprocess.run([*taut, "--resume", str(killed)]).returncode == 0
    assert subprocess.run([*taut, "--config", str(recipe), "--out", str(clean)]).returncode == 0
    a = json.loads((killed / "checkpoints" / "step-000010" / "trainer_state.json").read_text())["run"]   # inside phase "mix"
    b = json.loads((clean / "checkpoints" / "step-000010" / "trainer_state.json").read_text())["run"]
    assert a["mastery"] == b["mastery"] and len(a["mastery"]["history"]) > 0
    assert a["sampler_rng"] == b["sampler_rng"] and a["strategy"] == b["strategy"] and a["strategy"]["best_seen"]
    wa = load_file(str(killed / "checkpoints" / "step-000012" / "model.safetensors"))
    wb = load_file(str(clean / "checkpoints" / "step-000012" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_dry_run_prints_the_plan_and_rl_steps_cuts_it():
    config = load_config(None, ["phases=[{name: a, steps: 5}, {name: b, steps: 7, strategy: {name: mastery-gated}}]",
                                "rl.steps=8"])
    assert [(p.name, p.steps) for p in config.plan()] == [("a", 5), ("b", 3)]
    assert config.rl_steps() == 8
    with pytest.raises(Exception, match="exceeds the phases"):
        load_config(None, ["phases=[{name: a, steps: 5}]", "rl.steps=8"])

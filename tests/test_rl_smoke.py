"""The trainer on a tiny random model: parameters change and reward rises on a trivially learnable task."""

import json
import os

import torch

from taut.config import RunConfig
from taut.rl.trainer import train_rl

import toytask  # noqa: F401  (registers the toy:… task)


def test_grpo_raises_reward_and_changes_parameters(tmp_path):
    config = RunConfig.model_validate({
        "seed": 0,
        "model": {"preset": "tiny"},
        "data": {"train": ["toy:first-ok"], "pool_per_level": 40},
        "rl": {"steps": 30, "prompts_per_step": 8, "group_size": 8, "max_new_tokens": 4, "lr": 3e-3,
               "dynamic_sampling": False, "checkpoint_every": 100},
    })
    final = train_rl(config, tmp_path, quiet=True)
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "step-000000")
    end = AutoModelForCausalLM.from_pretrained(final)
    changed = [n for (n, a), (_, b) in zip(start.named_parameters(), end.named_parameters()) if not torch.equal(a, b)]
    assert len(changed) == len(list(start.parameters())), "every parameter tensor should move"

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "event" not in r]
    assert [r["step"] for r in records] == list(range(1, 31))
    first, last = records[0]["accuracy"], sum(r["accuracy"] for r in records[-5:]) / 5
    assert first < 0.2 and last > 0.6, (first, last)
    for key in ("reward", "length_mean", "truncation_rate", "cap", "step_time"):
        assert records[-1][key] is not None, key
    assert sum(r["entropy"] is not None and r["grad_norm"] > 0 for r in records) >= 10   # updated whenever a group had a spread


def test_mixed_precision_keeps_fp32_weights_and_trains(tmp_path):
    """`model.dtype: bf16-mixed` (what `auto` means on a GPU): fp32 weights, bf16 autocast."""
    config = RunConfig.model_validate({
        "model": {"path": os.environ.get("TAUT_TEST_MODEL", "builtin:testbed-sft"), "dtype": "bf16-mixed", "threads": 1},
        "data": {"train": ["gym:add"], "levels": [2, 3], "pool_per_level": 8},
        "rl": {"steps": 2, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 48, "lr": 1e-3},
    })
    final = train_rl(config, tmp_path, quiet=True)
    from safetensors.torch import load_file

    start = load_file(str(tmp_path / "checkpoints" / "step-000000" / "model.safetensors"))
    end = load_file(str(final / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in end.values())
    assert any(not torch.equal(start[k], end[k]) for k in start)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "event" not in line]
    assert all(r["loss"] is not None and abs(r["loss"]) < 1e3 for r in records if r["grad_norm"] is not None)

"""The trainer on a tiny random model: parameters change and reward rises on a trivially learnable task."""

import json

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

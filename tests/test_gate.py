"""The mastery gate ablation: with the gate off only unmastered groups' rewards change."""

import pytest
import torch

from taut.config import load_config
from taut.length import REGISTRY, build_strategy
from taut.length.base import GroupBatch
from taut.length.mastery import MasteryGatedConfig, MasteryGatedNoGateConfig


def _batch():
    # group 0 mastered (all correct), group 1 mixed (a short lucky answer and two long searches),
    # group 2 one correct, group 3 none correct
    correct = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    lengths = torch.tensor([[10, 12, 20, 10], [4, 6, 40, 60], [5, 30, 9, 9], [3, 50, 7, 7]])
    return GroupBatch(correct=correct, lengths=lengths, truncated=torch.zeros_like(correct), step=0, cap=128,
                      prompt_ids=("p", "q", "r", "s"))


def test_only_the_gate_changes():
    on = build_strategy(MasteryGatedConfig()).shape(_batch())
    off = build_strategy(MasteryGatedConfig(gate=False)).shape(_batch())
    by_name = build_strategy(MasteryGatedNoGateConfig()).shape(_batch())
    # the mastered group: identical shaped rewards, penalty 0, 0.2, min(0.5, 1.0), 0
    expected_mastered = torch.tensor([1.0, 0.8, 0.5, 1.0])
    torch.testing.assert_close(on.rewards[0], expected_mastered)
    torch.testing.assert_close(off.rewards[0], expected_mastered)
    # the mixed group: gate on leaves correctness; gate off penalises the searches against the
    # short correct answer (safe length 4: excess 9 and 14, capped at 0.5)
    torch.testing.assert_close(on.rewards[1], torch.tensor([1.0, 0.0, 1.0, 1.0]))
    torch.testing.assert_close(off.rewards[1], torch.tensor([1.0, 0.0, 0.5, 0.5]))
    # one correct rollout is its group's shortest correct one; nothing correct: nothing to penalise
    for out in (on, off):
        torch.testing.assert_close(out.rewards[2:], _batch().correct[2:].float())
    torch.testing.assert_close(by_name.rewards, off.rewards)
    assert on.metrics["gate_open"] == 0.25 and off.metrics["gate_open"] == 1.0
    assert on.metrics["penalised_frac"] == pytest.approx(2 / 16) and off.metrics["penalised_frac"] == pytest.approx(4 / 16)
    assert on.metrics["safe_len_mean"] == 10.0


def test_gate_off_keeps_the_other_settings_and_the_memory():
    cfg = dict(tau=0.75, slack=0.5, alpha=0.5, max_penalty=0.3, use_best_seen=True)
    on, off = build_strategy(MasteryGatedConfig(**cfg)), build_strategy(MasteryGatedConfig(**cfg, gate=False))
    a, b = on.shape(_batch()), off.shape(_batch())
    # group 0 (p = 1) and group 1 (p = 0.75) are mastered at tau 0.75: identical
    torch.testing.assert_close(a.rewards[:2], b.rewards[:2])
    assert on.best_seen == off.best_seen == {"p": 10, "q": 4, "r": 30}


def test_nogate_by_name_in_recipes_and_the_registry():
    assert "mastery-gated-nogate" in REGISTRY
    config = load_config(None, ["strategy.name=mastery-gated-nogate", "strategy.alpha=0.5"])
    assert config.strategy.gate is False and config.strategy.alpha == 0.5
    assert build_strategy(config.strategy).name == "mastery-gated-nogate"
    assert load_config(None, ["strategy.name=mastery-gated"]).strategy.gate is True
    assert load_config(None, ["strategy.name=mastery-gated", "strategy.gate=false"]).strategy.gate is False
    with pytest.raises(ValueError):
        MasteryGatedNoGateConfig(gate=True)

"""Length strategies: exact values of every formula on hand-computed groups, the registry, the CLI
listing, grouping rules, the mastery-gated memory and dynamic sampling after shaping."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from taut.config import ConfigError, RLConfig, load_config
from taut.length import REGISTRY, GroupBatch, build_strategy, get_entry
from taut.length.dapo import DapoHeavyConfig, DapoLiteConfig, DapoOverlongConfig
from taut.length.kimi import KimiConfig
from taut.length.l1 import L1ExactConfig, L1MaxConfig
from taut.length.mastery import MasteryGatedConfig
from taut.length.none import NoneConfig
from taut.length.on_policy_sft import OnPolicySftConfig
from taut.length.schedules import length_cap
from taut.length.sigmoid import GrpoLambdaConfig, SigmoidConfig
from taut.length.siri import SiriConfig
from taut.length.truncation import HardTruncationConfig, ThinkPruneConfig

ALL_NAMES = ["none", "siri", "mastery-gated", "mastery-gated-nogate", "dapo-overlong", "dapo-lite", "dapo-heavy", "hard-truncation",
             "thinkprune", "kimi", "l1-exact", "l1-max", "grpo-lambda", "sigmoid", "on-policy-sft", "dler", "alp",
             "shorter-better", "laser", "laser-d"]


def groups(correct, lengths, truncated=None, *, cap=128, step=0, ids=(), budgets=None) -> GroupBatch:
    correct = torch.tensor(correct, dtype=torch.bool)
    return GroupBatch(
        correct=correct,
        lengths=torch.tensor(lengths),
        truncated=torch.zeros_like(correct) if truncated is None else torch.tensor(truncated, dtype=torch.bool),
        step=step, cap=cap, prompt_ids=tuple(ids),
        budgets=None if budgets is None else torch.tensor(budgets),
    )


def shape(config, batch):
    return build_strategy(config).shape(batch)


def close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# grouping
# ---------------------------------------------------------------------------------------------


def test_from_flat_regroups_contiguous_rollouts():
    b = GroupBatch.from_flat(["a", "a", "b", "b"], [1, 0, 1, 1], [3, 4, 5, 6], [0, 0, 0, 1], step=2, cap=8)
    assert b.prompt_ids == ("a", "b")
    assert b.correct.tolist() == [[True, False], [True, True]]
    assert b.lengths.tolist() == [[3, 4], [5, 6]]
    assert b.truncated.tolist() == [[False, False], [False, True]]


def test_from_flat_rejects_a_group_split_across_the_batch_boundary():
    with pytest.raises(ValueError, match="'c' has 1 of 2 rollouts.*batch boundary"):
        GroupBatch.from_flat(["a", "a", "b", "b", "c"], [1] * 5, [3] * 5, [0] * 5, step=0, cap=8)
    with pytest.raises(ValueError, match="whole groups of 2"):
        GroupBatch.from_flat(["a", "a", "b"], [1] * 3, [3] * 3, [0] * 3, step=0, cap=8, group_size=2)


def test_from_flat_rejects_non_contiguous_groups():
    with pytest.raises(ValueError, match="'a' are not contiguous"):
        GroupBatch.from_flat(["a", "b", "a", "b"], [1] * 4, [3] * 4, [0] * 4, step=0, cap=8)
    with pytest.raises(ValueError, match="mixes prompts"):
        GroupBatch.from_flat(["a", "b", "a", "b"], [1] * 4, [3] * 4, [0] * 4, step=0, cap=8, group_size=2)


def test_from_flat_with_group_size_allows_a_prompt_drawn_twice():
    b = GroupBatch.from_flat(["a", "a", "a", "a"], [1, 0, 0, 0], [3, 4, 5, 6], [0] * 4, step=0, cap=8, group_size=2)
    assert b.prompt_ids == ("a", "a")
    assert b.correct.tolist() == [[True, False], [False, False]]


def test_from_flat_budgets_are_one_per_group():
    b = GroupBatch.from_flat(["a", "a", "b", "b"], [1] * 4, [3] * 4, [0] * 4, step=0, cap=8, budgets=[16, 16, 40, 40])
    assert b.budgets.tolist() == [16, 40]
    with pytest.raises(ValueError, match="one budget"):
        GroupBatch.from_flat(["a", "a"], [1, 1], [3, 3], [0, 0], step=0, cap=8, budgets=[16, 17])


# ---------------------------------------------------------------------------------------------
# registry and CLI
# ---------------------------------------------------------------------------------------------


def test_registry_lists_every_strategy_and_builds_each():
    assert list(REGISTRY) == ALL_NAMES
    for name, entry in REGISTRY.items():
        strategy = build_strategy(entry.config())
        assert strategy.name == name
        assert strategy.objective == ("sft" if name == "on-policy-sft" else "policy-gradient")


def test_unknown_strategy_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown strategy 'sirri'; valid strategies: none, siri, mastery-gated") as err:
        get_entry("sirri")
    assert all(name in str(err.value) for name in ALL_NAMES)
    with pytest.raises(ConfigError, match="unknown strategy 'shortest'.*valid strategies: none, siri"):
        load_config(None, ["strategy.name=shortest"])


def test_cli_strategies_json_lists_all_names():
    from taut.cli import app

    result = CliRunner().invoke(app, ["strategies", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.stdout)
    assert [s["name"] for s in listed] == ALL_NAMES
    by_name = {s["name"]: s for s in listed}
    assert by_name["mastery-gated"]["defaults"]["tau"] == 1.0
    assert by_name["siri"]["defaults"]["schedule"] == "cosine"
    assert "2509.25176" in by_name["siri"]["source"]


# ---------------------------------------------------------------------------------------------
# none
# ---------------------------------------------------------------------------------------------


def test_none_is_correctness_even_when_truncated():
    out = shape(NoneConfig(), groups([[1, 0, 1, 0]], [[5, 6, 128, 128]], [[0, 0, 1, 1]]))
    close(out.rewards, [[1, 0, 1, 0]])
    assert out.metrics == {}


# ---------------------------------------------------------------------------------------------
# SIRI schedules and the capping reward
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,expected", [
    # t = 0, T/4, T/2, 3T/4, T for T = 40, Lmax 128, Lmin 64
    ("cosine", [128, 96, 64, 96, 128]),
    ("stair", [64, 64, 128, 128, 64]),
    ("stair-cosine", [128, 96, 64, 96, 128]),
])
def test_schedule_values_at_quarter_periods(kind, expected):
    assert [length_cap(kind, t, 128, 64, 40) for t in (0, 10, 20, 30, 40)] == expected


def test_cosine_between_quarters_and_in_the_second_cycle():
    # 96 + 32·cos(π/4) = 118.63 → 119; 96 + 32·cos(3π/4) = 73.37 → 73
    assert length_cap("cosine", 5, 128, 64, 40) == 119
    assert length_cap("cosine", 15, 128, 64, 40) == 73
    assert length_cap("cosine", 45, 128, 64, 40) == 119
    assert length_cap("cosine", 60, 128, 64, 40) == 64


def test_stair_switches_at_half_period():
    assert [length_cap("stair", t, 128, 48, 50) for t in (0, 24, 25, 49, 50, 75)] == [48, 48, 128, 128, 48, 128]


def test_stair_cosine_boundaries_at_period_640():
    cap = [length_cap("stair-cosine", t, 128, 64, 640) for t in range(641)]
    assert set(cap[0:80]) == {128}                        # Lmax on [0, 80)
    assert set(cap[240:400]) == {64}                      # Lmin on [240, 400)
    assert set(cap[560:640]) == {128}                     # Lmax on [560, 640)
    assert cap[640] == 128                                # the next cycle starts at Lmax
    falling, rising = cap[80:240], cap[400:560]
    assert all(a >= b for a, b in zip(falling, falling[1:])) and falling[0] == 128 and falling[-1] == 64
    assert all(a <= b for a, b in zip(rising, rising[1:])) and rising[0] == 64 and rising[-1] == 128
    # 96 + 32·cos(2(φ − π/4)) at t = 120, 160, 200; 96 + 32·cos(2(φ − 3π/4)) at t = 440, 480, 520
    assert [cap[t] for t in (120, 160, 200)] == [119, 96, 73]
    assert [cap[t] for t in (440, 480, 520)] == [73, 96, 119]


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="valid schedules: cosine, stair, stair-cosine"):
        length_cap("linear", 0, 128, 64, 40)
    with pytest.raises(ValueError, match="period must be positive"):
        length_cap("cosine", 0, 128, 64, 0)
    with pytest.raises(ValueError, match="must not exceed"):
        SiriConfig(l_max=32, l_min=64)


def test_siri_cap_follows_its_schedule_not_the_default():
    siri = build_strategy(SiriConfig(schedule="cosine", l_max=128, l_min=48, period=40))
    assert [siri.cap(t, default=999) for t in (0, 10, 20, 30, 40)] == [128, 88, 48, 88, 128]


def test_siri_truncated_rollouts_score_zero():
    out = shape(SiriConfig(), groups([[1, 1, 0, 1]], [[10, 64, 64, 12]], [[0, 1, 1, 0]], cap=64))
    close(out.rewards, [[1, 0, 0, 1]])
    assert out.metrics == {"penalised_frac": 0.25, "penalty_mean": 1.0}


@pytest.mark.parametrize("correct,truncated,expected,penalised", [
    ([[1, 1, 1, 1]], [[0, 0, 0, 0]], [[1, 1, 1, 1]], 0.0),     # all correct
    ([[0, 0, 0, 0]], [[0, 1, 0, 1]], [[0, 0, 0, 0]], 0.0),     # none correct
    ([[0, 1, 0, 0]], [[0, 0, 0, 0]], [[0, 1, 0, 0]], 0.0),     # one correct
    ([[1, 1, 0, 1]], [[1, 1, 1, 1]], [[0, 0, 0, 0]], 0.75),    # all truncated
])
def test_capping_reward_cases(correct, truncated, expected, penalised):
    for config in (SiriConfig(), HardTruncationConfig(), ThinkPruneConfig()):
        out = shape(config, groups(correct, [[48] * 4], truncated, cap=48))
        close(out.rewards, expected)
        assert out.metrics["penalised_frac"] == penalised


def test_hard_truncation_cap_is_fixed():
    strategy = build_strategy(HardTruncationConfig(cap=40))
    assert [strategy.cap(t, default=128) for t in (0, 1, 500)] == [40, 40, 40]


def test_thinkprune_lowers_the_cap_in_stages():
    strategy = build_strategy(ThinkPruneConfig(caps=[96, 72, 48], steps_per_stage=30))
    assert [strategy.cap(t, default=128) for t in (0, 29, 30, 59, 60, 89, 1000)] == [96, 96, 72, 72, 48, 48, 48]
    with pytest.raises(ValueError, match="never rise"):
        ThinkPruneConfig(caps=[48, 72])
    with pytest.raises(ValueError, match="positive"):
        ThinkPruneConfig(caps=[64, 0])


# ---------------------------------------------------------------------------------------------
# mastery-gated
# ---------------------------------------------------------------------------------------------


def test_mastery_all_correct_penalises_longer_than_shortest_capped():
    # s = 10; excess 0, 0.2, 1.0, 0 → penalty 0, 0.2, min(0.5, 1.0), 0
    out = shape(MasteryGatedConfig(support=1), groups([[1, 1, 1, 1]], [[10, 12, 20, 10]]))
    close(out.rewards, [[1.0, 0.8, 0.5, 1.0]])
    assert out.metrics["gate_open"] == 1.0
    assert out.metrics["penalised_frac"] == 0.5
    assert out.metrics["penalty_mean"] == pytest.approx(0.35)
    assert out.metrics["safe_len_mean"] == 10.0


def test_mastery_ties_in_length():
    out = shape(MasteryGatedConfig(support=1), groups([[1, 1, 1, 1]], [[10, 10, 10, 10]]))
    close(out.rewards, [[1, 1, 1, 1]])
    assert out.metrics["penalised_frac"] == 0.0 and out.metrics["penalty_mean"] == 0.0
    # two share the shortest length: neither is penalised; 15 → 0.5·0.5 = 0.25; 30 → min(0.5, 0.5·2)
    out = shape(MasteryGatedConfig(support=1, alpha=0.5), groups([[1, 1, 1, 1]], [[10, 10, 15, 30]]))
    close(out.rewards, [[1.0, 1.0, 0.75, 0.5]])


def test_mastery_one_correct_gate_closed_at_default_tau():
    out = shape(MasteryGatedConfig(support=1), groups([[1, 0, 0, 0]], [[20, 5, 6, 7]]))
    close(out.rewards, [[1, 0, 0, 0]])
    assert out.metrics["gate_open"] == 0.0 and out.metrics["penalised_frac"] == 0.0
    assert math.isnan(out.metrics["safe_len_mean"])
    # gate open at τ = 0.25, but the one correct rollout is the shortest correct one; wrong ones untouched
    out = shape(MasteryGatedConfig(support=1, tau=0.25), groups([[1, 0, 0, 0]], [[20, 5, 60, 7]]))
    close(out.rewards, [[1, 0, 0, 0]])
    assert out.metrics["gate_open"] == 1.0 and out.metrics["safe_len_mean"] == 20.0


def test_mastery_none_correct_and_all_truncated():
    out = shape(MasteryGatedConfig(support=1, tau=0.25), groups([[0, 0, 0, 0]], [[5, 9, 30, 2]]))
    close(out.rewards, [[0, 0, 0, 0]])
    assert out.metrics["gate_open"] == 0.0
    # truncation is not a penalty here: correct truncated rollouts keep their reward
    out = shape(MasteryGatedConfig(support=1), groups([[1, 1, 0, 1]], [[20, 20, 20, 20]], [[1, 1, 1, 1]], cap=20))
    close(out.rewards, [[1, 1, 0, 1]])


def test_mastery_mixed_batch_with_tau_slack_and_cap():
    config = MasteryGatedConfig(support=1, tau=0.75, slack=0.25, alpha=0.5, max_penalty=0.3)
    out = shape(config, groups(
        [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]],
        [[8, 10, 20, 4], [30, 40, 5, 5], [16, 18, 24, 16]],
    ))
    # group 0: p = 0.75 → gated, s = 1.25·8 = 10; 20 → min(0.3, 0.5·1.0) = 0.3
    # group 1: p = 0.5 → not gated
    # group 2: s = 1.25·16 = 20; 24 → 0.5·0.2 = 0.1
    close(out.rewards, [[1, 1, 0.7, 0], [1, 1, 0, 0], [1, 1, 0.9, 1]])
    assert out.metrics["gate_open"] == pytest.approx(2 / 3)
    assert out.metrics["penalised_frac"] == pytest.approx(2 / 12)
    assert out.metrics["penalty_mean"] == pytest.approx(0.2)
    assert out.metrics["safe_len_mean"] == 15.0


def test_mastery_keeps_partial_credit_where_it_does_not_penalise():
    """A grader's partial credit (reasoning-gym scores a wrong answer that contains the right one
    with len(right) / len(answer)) is the base reward, as for every other strategy: the gate and the
    penalty act on correct rollouts only, and a partially right answer keeps its score."""
    closed = groups([[1, 0, 0, 0]], [[20, 5, 6, 7]])
    closed = dataclasses.replace(closed, scores=torch.tensor([[1.0, 0.5, 0.0, 0.25]]))
    out = shape(MasteryGatedConfig(support=1), closed)
    close(out.rewards, [[1.0, 0.5, 0.0, 0.25]])
    assert out.metrics["penalised_frac"] == 0.0                     # nothing was penalised
    gated = groups([[1, 1, 1, 0]], [[10, 12, 20, 4]])
    gated = dataclasses.replace(gated, scores=torch.tensor([[1.0, 1.0, 1.0, 0.5]]))
    out = shape(MasteryGatedConfig(support=1, tau=0.75), gated)
    close(out.rewards, [[1.0, 0.8, 0.5, 0.5]])                      # the wrong rollout keeps its 0.5
    for config in (MasteryGatedConfig(support=1, gate=False), NoneConfig()):   # the ablation and the control agree
        assert shape(config, closed).rewards[0, 1] == 0.5


def test_mastery_correct_always_scores_above_wrong():
    out = shape(MasteryGatedConfig(support=1, alpha=100.0, max_penalty=0.9), groups([[1, 1, 1, 1]], [[5, 100, 6, 5]]))
    close(out.rewards, [[1.0, 0.1, 0.1, 1.0]])
    with pytest.raises(ValueError):
        MasteryGatedConfig(support=1, max_penalty=1.0)


def test_mastery_best_seen_memory_across_batches_and_checkpoints():
    strategy = build_strategy(MasteryGatedConfig(support=1, use_best_seen=True))
    # batch 1: p gated with s = 12; q not gated (one correct, length 9)
    out = strategy.shape(groups([[1, 1, 1, 1], [1, 0, 0, 0]], [[12, 14, 12, 16], [9, 3, 3, 3]], ids=["p", "q"]))
    close(out.rewards, [[1, 1 - 2 / 12, 1, 1 - 4 / 12], [1, 0, 0, 0]])
    assert strategy.best_seen == {"p": 12, "q": 9}

    # batch 2: p's group is all 15+, but the best seen (12) sets s; q's best seen (9) is below its group's 10
    batch2 = groups([[1, 1, 1, 1], [1, 1, 1, 1]], [[15, 15, 18, 15], [10, 11, 10, 10]], ids=["p", "q"])
    out = strategy.shape(batch2)
    close(out.rewards, [[0.75, 0.75, 0.5, 0.75], [1 - 1 / 9, 1 - 2 / 9, 1 - 1 / 9, 1 - 1 / 9]])
    assert out.metrics["safe_len_mean"] == pytest.approx(10.5)
    assert strategy.best_seen == {"p": 12, "q": 9}
    # without the memory, the same group's own shortest (15) is the safe length
    close(shape(MasteryGatedConfig(support=1), batch2).rewards[0], [1.0, 1.0, 0.8, 1.0])

    # batch 3: a shorter correct rollout lowers p's best
    strategy.shape(groups([[1, 1, 1, 1]], [[6, 6, 6, 6]], ids=["p"]))
    assert strategy.best_seen == {"p": 6, "q": 9}

    # the state goes through a checkpoint's JSON and back
    state = json.loads(json.dumps(strategy.state_dict()))
    assert state == {"best_seen": {"p": 6, "q": 9}}
    restored = build_strategy(MasteryGatedConfig(support=1, use_best_seen=True))
    restored.load_state_dict(state)
    assert restored.best_seen == {"p": 6, "q": 9}
    probe = groups([[1, 1, 1, 1]], [[7, 7, 8, 7]], ids=["p"])
    close(restored.shape(probe).rewards, [[1 - 1 / 6, 1 - 1 / 6, 1 - 2 / 6, 1 - 1 / 6]])   # s = 6, the restored best
    close(shape(MasteryGatedConfig(support=1), probe).rewards, [[1, 1, 1 - 1 / 7, 1]])               # s = 7 without memory
    restored.load_state_dict({})                                        # a fresh phase starts empty
    assert restored.best_seen == {}


def test_mastery_support_keeps_one_lucky_short_answer_from_setting_the_reference():
    # the level-2 failure: all correct, one direct answer of 5 tokens among thinking ones of 30–40
    lucky = groups([[1, 1, 1, 1]], [[5, 30, 36, 40]])
    close(shape(MasteryGatedConfig(support=1), lucky).rewards, [[1, 0.5, 0.5, 0.5]])        # s = 5: every thinker capped
    out = shape(MasteryGatedConfig(support=2), lucky)                                # s = 30, the second shortest
    close(out.rewards, [[1, 1, 1 - 6 / 30, 1 - 10 / 30]])
    assert out.metrics["safe_len_mean"] == 30.0
    # reproduced short answers do set it: two of 5 tokens
    close(shape(MasteryGatedConfig(support=2), groups([[1, 1, 1, 1]], [[5, 5, 6, 40]])).rewards, [[1, 1, 0.8, 0.5]])
    # fewer correct rollouts than the support: no penalty, gate or not
    out = shape(MasteryGatedConfig(tau=0.25, support=3), groups([[1, 1, 0, 0]], [[5, 40, 2, 2]]))
    close(out.rewards, [[1, 1, 0, 0]])
    assert out.metrics["penalised_frac"] == 0.0
    # a support above the group size never penalises
    close(shape(MasteryGatedConfig(support=5), lucky).rewards, [[1, 1, 1, 1]])


def test_mastery_default_support_is_half_the_group():
    assert MasteryGatedConfig().support == "half"
    # G = 8: m = 4, s = 32; the direct answers of 5 and 6 tokens set nothing
    eight = groups([[1] * 8], [[5, 6, 30, 32, 33, 35, 40, 64]])
    close(shape(MasteryGatedConfig(), eight).rewards, [[1, 1, 1, 1, 1 - 1 / 32, 1 - 3 / 32, 1 - 8 / 32, 0.5]])
    assert shape(MasteryGatedConfig(), eight).metrics["safe_len_mean"] == 32.0
    # G = 4: m = 2; G = 3: m = 2 (⌈3/2⌉); the same as the integer
    four = groups([[1, 1, 1, 1]], [[5, 30, 36, 40]])
    close(shape(MasteryGatedConfig(), four).rewards, shape(MasteryGatedConfig(support=2), four).rewards)
    three = groups([[1, 1, 1]], [[5, 30, 36]])
    close(shape(MasteryGatedConfig(), three).rewards, [[1, 1, 1 - 6 / 30]])
    # with visits, half of this group's size, over the pooled rollouts
    pooled = build_strategy(MasteryGatedConfig(visits=2))
    pooled.shape(groups([[1, 1, 1, 1]], [[4, 4, 50, 50]], ids=["p"]))
    close(pooled.shape(groups([[1, 1, 1, 1]], [[5, 30, 36, 40]], ids=["p"])).rewards, [[1 - 1 / 4, 0.5, 0.5, 0.5]])   # s = 4, reproduced
    for bad in (0, -1, "quarter", 1.5):
        with pytest.raises(ValidationError):
            MasteryGatedConfig(support=bad)


def test_mastery_visits_pool_pass_rate_and_reference_across_a_prompts_groups():
    strategy = build_strategy(MasteryGatedConfig(visits=2, support=2))
    # visit 1 of p: a lucky direct answer, half the group wrong → p = 0.5: gate closed
    out = strategy.shape(groups([[1, 0, 0, 1]], [[5, 5, 5, 30]], ids=["p"]))
    close(out.rewards, [[1, 0, 0, 1]])
    assert strategy.visits == {"p": [[(5, True), (5, False), (5, False), (30, True)]]}
    # visit 2: all correct alone would open the gate with s = 6 (the second shortest);
    # pooled with visit 1: p = 6/8 < 1 → closed
    second = groups([[1, 1, 1, 1]], [[6, 6, 32, 34]], ids=["p"])
    close(strategy.shape(second).rewards, [[1, 1, 1, 1]])
    close(shape(MasteryGatedConfig(support=2), second).rewards, [[1, 1, 0.5, 0.5]])
    # visit 3: only visits 2 and 3 are pooled (visits=2): p = 1, correct lengths 6, 6, 32, 34, 30, 30, 31, 40
    # → second shortest 6
    out = strategy.shape(groups([[1, 1, 1, 1]], [[30, 30, 31, 40]], ids=["p"]))
    close(out.rewards, [[0.5, 0.5, 0.5, 0.5]])
    assert [len(g) for g in strategy.visits["p"]] == [4]                 # the last visits − 1 groups kept
    # at τ = 0.75 the pooled rate of visits 1 and 2 (6/8) opens it
    opened = build_strategy(MasteryGatedConfig(visits=2, support=2, tau=0.75))
    opened.shape(groups([[1, 0, 0, 1]], [[5, 5, 5, 30]], ids=["p"]))
    # pooled correct lengths 5, 6, 6, 30, 32, 34 → s = 6 (the second shortest: the one correct 5 does not count)
    close(opened.shape(second).rewards, [[1, 1, 0.5, 0.5]])
    # the memory goes through a checkpoint's JSON and back
    state = json.loads(json.dumps(strategy.state_dict()))
    restored = build_strategy(MasteryGatedConfig(visits=2, support=2))
    restored.load_state_dict(state)
    assert restored.visits == strategy.visits and restored.best_seen == strategy.best_seen
    probe = groups([[1, 1, 1, 1]], [[7, 7, 8, 7]], ids=["p"])
    close(restored.shape(probe).rewards, strategy.shape(probe).rewards.tolist())
    with pytest.raises(ValueError, match="prompt ids"):
        shape(MasteryGatedConfig(support=1, visits=2), groups([[1, 1]], [[3, 4]]))


def test_mastery_best_seen_needs_prompt_ids():
    with pytest.raises(ValueError, match="prompt ids"):
        shape(MasteryGatedConfig(support=1, use_best_seen=True), groups([[1, 1]], [[3, 4]]))


def test_stateless_strategy_refuses_state():
    with pytest.raises(ValueError, match="keeps no state"):
        build_strategy(KimiConfig()).load_state_dict({"best_seen": {}})


# ---------------------------------------------------------------------------------------------
# DAPO overlong buffer
# ---------------------------------------------------------------------------------------------


def test_dapo_overlong_buffer_before_the_cap():
    # cap 100, buffer 20 → R_len starts after 80: 85 → −0.25, 100 → −1; halved on the {0, 1} reward
    out = shape(DapoOverlongConfig(), groups([[1, 1, 0, 1]], [[50, 80, 85, 100]], [[0, 0, 0, 1]], cap=100))
    close(out.rewards, [[1, 1, -0.125, 0.5]])
    assert out.metrics == {"penalised_frac": 0.5, "penalty_mean": pytest.approx(0.3125)}


def test_dapo_overlong_explicit_max_length():
    # L_max 90, buffer 45 → start 45: 60 → −15/45; 90 → −1; 100 > L_max → −1 (each halved)
    out = shape(DapoOverlongConfig(max_length=90, buffer_fraction=0.5), groups([[1, 1, 1, 1]], [[40, 60, 90, 100]], cap=128))
    close(out.rewards, [[1, 5 / 6, 0.5, 0.5]])


def test_dapo_presets():
    assert build_strategy(DapoLiteConfig()).name == "dapo-lite"
    # lite: buffer 32 (start 96), half strength
    out = shape(DapoLiteConfig(), groups([[1, 1, 1, 0]], [[96, 112, 128, 64]], cap=128))
    close(out.rewards, [[1, 0.875, 0.75, 0]])
    # heavy: buffer 96 (start 32), full strength
    out = shape(DapoHeavyConfig(), groups([[1, 1, 1, 1]], [[32, 56, 80, 128]], cap=128))
    close(out.rewards, [[1, 0.875, 0.75, 0.5]])


def test_dapo_all_truncated_and_none_correct():
    out = shape(DapoOverlongConfig(), groups([[1, 0, 1, 0]], [[64] * 4], [[1] * 4], cap=64))
    close(out.rewards, [[0.5, -0.5, 0.5, -0.5]])
    out = shape(DapoOverlongConfig(), groups([[0, 0, 0, 0]], [[10, 20, 30, 40]], cap=40))
    close(out.rewards, [[0, 0, 0, -0.5]])


# ---------------------------------------------------------------------------------------------
# Kimi
# ---------------------------------------------------------------------------------------------


def test_kimi_group_min_max_reward():
    # λ = 0.5, 0.25, 0, −0.5; wrong ones keep only min(0, λ); weight 0.5
    out = shape(KimiConfig(), groups([[1, 1, 0, 0]], [[10, 20, 30, 50]]))
    close(out.rewards, [[1.25, 1.125, 0, -0.25]])
    assert out.metrics == {"penalised_frac": 0.25, "penalty_mean": 0.25}


def test_kimi_cases():
    close(shape(KimiConfig(weight=1.0), groups([[1, 1, 1]], [[10, 20, 30]])).rewards, [[1.5, 1.0, 0.5]])   # all correct
    close(shape(KimiConfig(), groups([[0, 0]], [[10, 30]])).rewards, [[0, -0.25]])                       # none correct
    close(shape(KimiConfig(), groups([[1, 0, 1]], [[7, 7, 7]])).rewards, [[1, 0, 1]])                    # ties: no length reward
    close(shape(KimiConfig(), groups([[0, 1, 0, 0]], [[40, 40, 20, 60]])).rewards, [[0, 1.0, 0, -0.25]])  # one correct


# ---------------------------------------------------------------------------------------------
# L1
# ---------------------------------------------------------------------------------------------


def test_l1_exact_penalises_deviation_both_ways():
    out = shape(L1ExactConfig(alpha=0.01), groups([[1, 1, 1, 0]], [[50, 40, 70, 60]], budgets=[50]))
    close(out.rewards, [[1.0, 0.9, 0.8, -0.1]])
    assert out.metrics["budget_mean"] == 50.0
    assert out.metrics["budget_abs_error"] == 10.0
    assert out.metrics["penalised_frac"] == 0.75
    assert out.metrics["penalty_mean"] == pytest.approx(0.4 / 3)


def test_l1_max_multiplies_correctness():
    out = shape(L1MaxConfig(alpha=0.01, delta=0.5), groups([[1, 1, 1, 1], [0, 0, 1, 0]],
                                                          [[50, 40, 110, 10], [10, 20, 30, 40]], budgets=[50, 30]))
    close(out.rewards, [[0.5, 0.6, 0.0, 0.9], [0, 0, 0.5, 0]])


def test_l1_budgets_in_range_and_required():
    rng = np.random.default_rng(0)
    strategy = build_strategy(L1ExactConfig(n_min=8, n_max=12))
    draws = [strategy.budget(rng) for _ in range(300)]
    assert set(draws) == {8, 9, 10, 11, 12}
    assert build_strategy(L1MaxConfig()).budget(rng) in range(8, 97)
    assert build_strategy(NoneConfig()).budget(rng) is None
    with pytest.raises(ValueError, match="needs the prompt budgets"):
        shape(L1ExactConfig(), groups([[1, 1]], [[3, 4]]))
    with pytest.raises(ValueError, match="must not exceed"):
        L1ExactConfig(n_min=50, n_max=10)


# ---------------------------------------------------------------------------------------------
# sigmoid (Arora & Zanette) and GRPO-λ
# ---------------------------------------------------------------------------------------------


def test_sigmoid_all_correct():
    # μ = 25, σ = √125 = 11.18; z = ±0.447, ±1.342
    out = shape(SigmoidConfig(alpha=0.1), groups([[1, 1, 1, 1]], [[10, 20, 30, 40]]))
    close(out.rewards, [[0.979276, 0.960998, 0.939002, 0.920724]])


def test_sigmoid_cases():
    # statistics over the correct ones only: μ = 20, σ = 10, z = ∓1
    close(shape(SigmoidConfig(), groups([[1, 1, 0, 0]], [[10, 30, 5, 100]])).rewards, [[0.973106, 0.926894, 0, 0]])
    close(shape(SigmoidConfig(), groups([[1, 0, 0, 0]], [[40, 5, 6, 7]])).rewards, [[0.95, 0, 0, 0]])     # one correct
    close(shape(SigmoidConfig(), groups([[1, 1, 1]], [[9, 9, 9]])).rewards, [[0.95, 0.95, 0.95]])         # ties
    out = shape(SigmoidConfig(), groups([[0, 0, 0]], [[9, 3, 12]]))                                      # none correct
    close(out.rewards, [[0, 0, 0]])
    assert out.metrics == {"penalised_frac": 0.0, "penalty_mean": 0.0}


def test_grpo_lambda_penalises_only_the_top_groups():
    batch = groups([[1, 0], [1, 1], [1, 1], [0, 0]], [[10, 30], [10, 30], [20, 20], [5, 5]])
    out = shape(GrpoLambdaConfig(fraction=0.5, alpha=0.6), batch)
    # top ⌈0.5·4⌉ = 2 by correctness ratio: groups 1 and 2; z = ∓1 in group 1, 0 in group 2
    close(out.rewards, [[1, 0], [0.838635, 0.561365], [0.7, 0.7], [0, 0]])
    assert out.metrics["gate_open"] == 0.5
    assert out.metrics["penalised_frac"] == 0.5
    # ties in ratio at the boundary: ⌈0.25·4⌉ = 1 group, the first in batch order
    out = shape(GrpoLambdaConfig(fraction=0.25, alpha=0.6), batch)
    close(out.rewards, [[1, 0], [0.838635, 0.561365], [1, 1], [0, 0]])
    assert out.metrics["gate_open"] == 0.25


def test_grpo_lambda_group_count_is_exact():
    # 0.28·25 is 7.000000000000001 in floating point: still 7 groups, not 8
    batch = groups([[1, 1]] * 25, [[10, 30]] * 25)
    for fraction, k in ((0.28, 7), (0.2, 5), (0.01, 1), (1.0, 25)):
        selected = (shape(GrpoLambdaConfig(fraction=fraction), batch).rewards < 1).any(dim=1)
        assert selected.tolist() == [True] * k + [False] * (25 - k), fraction


# ---------------------------------------------------------------------------------------------
# on-policy SFT
# ---------------------------------------------------------------------------------------------


def test_on_policy_sft_keeps_correct_untruncated():
    batch = groups([[1, 1, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], [[10, 6, 4, 3], [5, 5, 5, 5], [8, 6, 6, 9]],
                   [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    out = shape(OnPolicySftConfig(), batch)
    close(out.rewards, [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert out.metrics == {"kept_frac": 0.5}
    # shortest: the truncated 3-token rollout is not kept; the tie at 6 goes to the first
    out = shape(OnPolicySftConfig(keep="shortest"), batch)
    close(out.rewards, [[0, 1, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0]])


# ---------------------------------------------------------------------------------------------
# dynamic sampling keeps a gated group that the penalty made unequal
# ---------------------------------------------------------------------------------------------


class _WordPolicy:
    """Token 1 is the word `ok`, anything else `x`; every prompt encodes to one token."""

    def encode_prompt(self, text):
        return [0]

    def decode(self, ids):
        return " ".join("ok" if t == 1 else "x" for t in ids)


class _ScriptedEngine:
    """Returns the same scripted group of responses for the i-th prompt of every call."""

    def __init__(self, scripted):
        self.scripted = scripted

    def generate(self, prompts, n, params, generator=None, response_prefix=None, ban_first=None):
        from taut.rollout import Rollouts

        tokens = [list(r) for group in self.scripted[: len(prompts)] for r in group]
        return Rollouts(prompt_index=[i for i in range(len(prompts)) for _ in range(n)], tokens=tokens,
                        truncated=[False] * len(tokens))


class _OkTask:
    name = "toy:ok"

    def verify(self, problem, response, complete):
        from taut.tasks import Verdict

        words = response.split()
        return Verdict(correct=bool(words) and words[0] == "ok", extracted=words[0] if words else None)

    def with_budget(self, problem, budget):
        return problem


@pytest.mark.parametrize("config,kept", [
    (MasteryGatedConfig(support=1), [[1.0, 1.0, 0.5, 0.5]]),   # the all-correct group with unequal lengths survives
    (NoneConfig(), []),                               # without the penalty its rewards are all 1: dropped
])
def test_dynamic_sampling_keeps_a_penalised_mastered_group(config, kept):
    from taut.rl.data import PromptPool
    from taut.rl.objectives import build_objective
    from taut.rl.rollouts import collect
    from taut.tasks import Problem

    scripted = [
        [[1, 2], [1, 2], [1, 2, 2, 2], [1, 2, 2, 2]],   # all correct, lengths 2, 2, 4, 4: s = 2, excess 1 → 0.5
        [[1, 2]] * 4,                                    # all correct, equal lengths: equal rewards
        [[2, 2]] * 4,                                    # all wrong
    ]
    task = _OkTask()
    pool = PromptPool([(task, Problem(id=f"p{i}", prompt="q", answer="ok", domain="toy")) for i in range(3)], seed=0)
    cfg = RLConfig(prompts_per_step=3, group_size=4, max_sampling_rounds=1, dynamic_sampling=True)
    strategy = build_strategy(config)
    out = collect(_WordPolicy(), _ScriptedEngine(scripted), pool.next, strategy, build_objective(strategy, cfg.loss).informative, cfg.sampling,
                  step=0, cap=8, generator=None, np_rng=np.random.default_rng(0))
    assert [r.tolist() for r in out.rewards] == kept
    assert out.groups_sampled == 3
    if isinstance(config, MasteryGatedConfig):
        assert out.strategy_metrics["gate_open"] == pytest.approx(2 / 3)
        assert out.strategy_metrics["penalised_frac"] == pytest.approx(2 / 12)


class _PartialTask(_OkTask):
    """Partial credit: `ok` scores 1, `x` followed by `ok` scores 0.5, anything else 0."""

    def verify(self, problem, response, complete):
        from taut.tasks import Verdict

        words = response.split()
        score = 1.0 if words[:1] == ["ok"] else 0.5 if words[:2] == ["x", "ok"] else 0.0
        return Verdict(correct=score == 1.0, extracted=words[0] if words else None, score=score)


def test_partial_scores_are_the_base_reward_and_correct_stays_score_one():
    from taut.rl.data import PromptPool
    from taut.rl.objectives import build_objective
    from taut.rl.rollouts import collect
    from taut.tasks import Problem

    scripted = [[[1, 2], [2, 1], [2, 2], [1]]]            # ok x → 1, x ok → 0.5, x x → 0, ok → 1
    pool = PromptPool([(_PartialTask(), Problem(id="p0", prompt="q", answer="ok", domain="toy"))], seed=0)
    cfg = RLConfig(prompts_per_step=1, group_size=4, max_sampling_rounds=1, dynamic_sampling=False)
    strategy = build_strategy(NoneConfig())
    out = collect(_WordPolicy(), _ScriptedEngine(scripted), pool.next, strategy, build_objective(strategy, cfg.loss).informative, cfg.sampling,
                  step=0, cap=8, generator=None, np_rng=np.random.default_rng(0))
    assert out.rewards[0].tolist() == [1.0, 0.5, 0.0, 1.0]
    assert out.sampled["correct"] == [True, False, False, True] and out.sampled["score"] == [1.0, 0.5, 0.0, 1.0]

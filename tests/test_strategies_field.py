"""The field's strongest simple baselines (issue 39): DLER, ALP and ShorterBetter.

Exact values computed by hand from each paper's formula on small groups, edge cases (no correct
rollout, all truncated, a group of one, partial credit), DLER's batch-wise advantage normalisation
through the trainer's objective, and slow loops against the vectorised code."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from taut.config import RLConfig, load_config
from taut.length import REGISTRY, GroupBatch, build_strategy
from taut.length.alp import AlpConfig
from taut.length.dler import DlerConfig
from taut.length.shorter_better import ShorterBetterConfig
from taut.rl.advantages import group_advantages
from taut.rl.objectives import build_objective, resolve_adv_norm


def groups(correct, lengths, truncated=None, *, cap=100, scores=None) -> GroupBatch:
    correct = torch.tensor(correct, dtype=torch.bool)
    return GroupBatch(
        correct=correct,
        lengths=torch.tensor(lengths),
        truncated=torch.zeros_like(correct) if truncated is None else torch.tensor(truncated, dtype=torch.bool),
        step=0, cap=cap,
        scores=None if scores is None else torch.tensor(scores, dtype=torch.float32),
    )


def shape(config, batch):
    return build_strategy(config).shape(batch)


def close(actual: torch.Tensor, expected) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=0)


def test_registered_with_sources_and_listed_by_the_cli():
    assert {"dler", "alp", "shorter-better"} <= set(REGISTRY)
    assert "2510.15110" in REGISTRY["dler"].source
    assert "2506.05256" in REGISTRY["alp"].source
    assert "2504.21370" in REGISTRY["shorter-better"].source
    from taut.cli import app

    result = CliRunner().invoke(app, ["strategies", "--json"])
    assert result.exit_code == 0, result.output
    by_name = {s["name"]: s for s in json.loads(result.stdout)}
    assert by_name["dler"]["defaults"] == {"name": "dler", "max_length": None, "truncated_scale": 0.0}
    assert by_name["alp"]["defaults"] == {"name": "alp", "beta": 0.5, "normalizer": None}
    assert by_name["shorter-better"]["defaults"] == {"name": "shorter-better", "alpha": 2.0, "beta": 0.001}


def test_configs_refuse_out_of_range_values():
    from taut.config import ConfigError

    with pytest.raises(ConfigError, match="truncated_scale"):
        load_config(None, ["strategy.name=dler", "strategy.truncated_scale=1.5"])
    with pytest.raises(ConfigError, match="beta"):
        load_config(None, ["strategy.name=alp", "strategy.beta=0"])
    with pytest.raises(ConfigError, match="normalizer"):
        load_config(None, ["strategy.name=alp", "strategy.normalizer=0"])
    with pytest.raises(ConfigError, match="alpha"):
        load_config(None, ["strategy.name=shorter-better", "strategy.alpha=-1"])


# ---------------------------------------------------------------------------------------------
# DLER: r = correct · (1 − truncated); advantages (r − group mean) / batch std of (r − group mean)
# ---------------------------------------------------------------------------------------------


def test_dler_truncated_rollouts_score_zero():
    out = shape(DlerConfig(), groups([[1, 1, 0, 1]], [[20, 100, 30, 100]], [[0, 1, 0, 1]]))
    close(out.rewards, [[1, 0, 0, 0]])
    assert out.metrics == {"penalised_frac": 0.5, "penalty_mean": 1.0}     # the two correct truncated ones lose 1


def test_dler_truncated_scale_of_the_released_script():
    out = shape(DlerConfig(truncated_scale=0.1), groups([[1, 1, 0, 1]], [[20, 100, 30, 100]], [[0, 1, 0, 1]]))
    close(out.rewards, [[1, 0.1, 0, 0.1]])
    assert out.metrics["penalty_mean"] == pytest.approx(0.9)


def test_dler_edge_cases():
    close(shape(DlerConfig(), groups([[1, 1], [0, 1]], [[100, 100]] * 2, [[1, 1], [1, 1]])).rewards, [[0, 0], [0, 0]])  # all truncated
    close(shape(DlerConfig(), groups([[0, 0, 0]], [[10, 20, 100]], [[0, 0, 1]])).rewards, [[0, 0, 0]])    # none correct
    close(shape(DlerConfig(), groups([[1]], [[30]])).rewards, [[1]])                                      # a group of one
    close(shape(DlerConfig(), groups([[1]], [[100]], [[1]])).rewards, [[0]])
    scored = groups([[1, 0, 0]], [[10, 10, 100]], [[0, 0, 1]], scores=[[1.0, 0.5, 0.5]])                   # partial credit
    close(shape(DlerConfig(), scored).rewards, [[1, 0.5, 0]])


def test_dler_cap_is_the_truncation_length():
    assert build_strategy(DlerConfig()).cap(7, 128) == 128                 # rl.max_new_tokens
    assert build_strategy(DlerConfig(max_length=40)).cap(7, 128) == 40


def test_dler_declares_batch_centred_normalisation(caplog):
    dler = build_strategy(DlerConfig())
    assert dler.adv_norm == "batch-centred"
    assert resolve_adv_norm(None, dler) == "batch-centred"
    with caplog.at_level("WARNING"):
        assert resolve_adv_norm("group", dler) == "group"                  # a recipe may override, with a warning
    assert "dler" in caplog.text and "batch-centred" in caplog.text
    assert RLConfig(adv_norm="batch-centred").adv_norm == "batch-centred"


# Three groups of four: pass rates 1/4, 1/2 and an all-correct group (no signal).
#   c = r − group mean:  [.75, −.25, −.25, −.25], [.5, .5, −.5, −.5], [0, 0, 0, 0]
#   batch mean of c = 0, Σc² = .5625 + 3·.0625 + 4·.25 = 1.75, std = √(1.75 / 12)
BATCH_REWARDS = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
BATCH_CENTRED = [[0.75, -0.25, -0.25, -0.25], [0.5, 0.5, -0.5, -0.5], [0.0, 0.0, 0.0, 0.0]]


def test_batch_centred_advantages_exact():
    std = math.sqrt(1.75 / 12)
    adv = group_advantages(torch.tensor(BATCH_REWARDS), "batch-centred")
    close(adv, [[c / (std + 1e-6) for c in row] for row in BATCH_CENTRED])
    assert adv[0, 0].item() == pytest.approx(0.75 / std, abs=1e-4)         # 1.9640
    assert torch.equal(adv[2], torch.zeros(4))                            # an uninformative group stays at exactly 0
    # taut's `batch` divides by the std of the raw rewards instead: √(7/12 − (7/12)²) = √35 / 12
    raw = group_advantages(torch.tensor(BATCH_REWARDS), "batch")
    close(raw, [[c / (math.sqrt(35) / 12 + 1e-6) for c in row] for row in BATCH_CENTRED])
    assert raw[0, 0].item() < adv[0, 0].item()


def test_batch_centred_is_batch_wise_not_group_wise():
    # one group alone: c / std(c) — the group's own std, as GRPO; with a second group the scale is shared
    alone = group_advantages(torch.tensor([BATCH_REWARDS[1]]), "batch-centred")
    close(alone, [[1, 1, -1, -1]])
    together = group_advantages(torch.tensor(BATCH_REWARDS[:2]), "batch-centred")
    std = math.sqrt((0.5625 + 3 * 0.0625 + 4 * 0.25) / 8)
    close(together, [[c / (std + 1e-6) for c in row] for row in BATCH_CENTRED[:2]])
    assert group_advantages(torch.ones(3, 4), "batch-centred").abs().sum() == 0     # nothing to learn: no NaN


@pytest.mark.parametrize("value", [0.7, 1 / 3, -0.3])
def test_batch_centred_equal_rewards_not_representable_in_float32_give_exactly_zero(value):
    mixed = torch.tensor([1.0, 0.0, 0.7, 0.3, 1.0, 0.0, 0.0, 1.0])
    adv = group_advantages(torch.stack([torch.full((8,), value), mixed]), "batch-centred")
    assert torch.equal(adv[0], torch.zeros(8))
    assert adv[1].abs().max() > 0.01


def test_dler_advantages_through_the_trainer_objective():
    """The shaped rewards of a DLER batch, then the policy-gradient plan the trainer builds from them."""
    batch = groups([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]],
                   [[20, 100, 100, 100], [30, 40, 50, 60], [10, 10, 10, 10]],
                   [[0, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    strategy = build_strategy(DlerConfig())
    rewards = strategy.shape(batch).rewards
    close(rewards, BATCH_REWARDS)
    plan = build_objective(strategy, RLConfig()).plan(rewards, batch.lengths.flatten(), cap=100)
    std = math.sqrt(1.75 / 12)
    close(plan.advantages, [c / (std + 1e-6) for row in BATCH_CENTRED for c in row])
    assert plan.rows == list(range(8))                                     # the all-correct group adds nothing


def test_batch_centred_matches_a_loop():
    torch.manual_seed(0)
    rewards = (torch.rand(6, 5) * 3).round() / 3
    rewards[2] = 0.5                                                       # one uninformative group
    adv = group_advantages(rewards, "batch-centred")
    centred = []
    for row in rewards.tolist():
        m = sum(row) / len(row)
        spread = max(row) - min(row) > 1e-6
        centred.append([x - m if spread else 0.0 for x in row])
    flat = [x for row in centred for x in row]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / len(flat))
    close(adv, [[x / (std + 1e-6) for x in row] for row in centred])


# ---------------------------------------------------------------------------------------------
# ALP: r = correct − β · max(p_solved, 1/K) · ℓ / N
# ---------------------------------------------------------------------------------------------


def test_alp_scales_the_penalty_by_the_solve_rate():
    # β = 0.5, N = cap = 100
    out = shape(AlpConfig(), groups(
        [[1, 1, 1, 1],          # p = 1:    penalty 0.5·ℓ/100
         [1, 0, 0, 0],          # p = 1/4:  0.125·ℓ/100
         [0, 0, 0, 0],          # p = 0 → floor 1/K = 1/4
         [1, 1, 0, 0]],         # p = 1/2:  0.25·ℓ/100
        [[10, 20, 40, 100], [20, 20, 60, 100], [40, 40, 80, 100], [10, 50, 30, 100]]))
    close(out.rewards, [[0.95, 0.9, 0.8, 0.5],
                        [0.975, -0.025, -0.075, -0.125],
                        [-0.05, -0.05, -0.1, -0.125],
                        [0.975, 0.875, -0.075, -0.25]])
    # every rollout is penalised; the penalties sum to .85 + .25 + .325 + .475 = 1.9 over 16
    assert out.metrics["penalised_frac"] == 1.0
    assert out.metrics["penalty_mean"] == pytest.approx(1.9 / 16)


def test_alp_normalizer_and_beta():
    close(shape(AlpConfig(normalizer=50), groups([[1, 1, 1, 1]], [[10, 20, 40, 50]])).rewards, [[0.9, 0.8, 0.6, 0.5]])
    close(shape(AlpConfig(beta=1.0), groups([[1, 0]], [[50, 100]])).rewards, [[0.75, -0.5]])     # p = 1/2
    # N follows the step's cap when unset
    close(shape(AlpConfig(), groups([[1, 1]], [[32, 64]], cap=64)).rewards, [[0.75, 0.5]])


def test_alp_edge_cases():
    # all truncated at the cap: graded as the verifier says, length = the cap
    close(shape(AlpConfig(), groups([[1, 1]], [[100, 100]], [[1, 1]])).rewards, [[0.5, 0.5]])
    close(shape(AlpConfig(), groups([[0, 0]], [[100, 100]], [[1, 1]])).rewards, [[-0.25, -0.25]])   # floor 1/K = 1/2
    # a group of one: K = 1, so the weight is max(p, 1) = 1 either way
    close(shape(AlpConfig(), groups([[1]], [[40]])).rewards, [[0.8]])
    close(shape(AlpConfig(), groups([[0]], [[40]])).rewards, [[-0.2]])
    # partial credit is the base reward; the solve rate counts score-1 answers only (p = 1/2)
    close(shape(AlpConfig(), groups([[1, 0]], [[10, 10]], scores=[[1.0, 0.5]])).rewards, [[0.975, 0.475]])


def test_alp_matches_a_loop():
    torch.manual_seed(1)
    correct = torch.rand(5, 6) < 0.5
    correct[0] = False
    correct[1] = True
    lengths = torch.randint(1, 129, (5, 6))
    rewards = shape(AlpConfig(beta=0.3), groups(correct.int().tolist(), lengths.tolist(), cap=128)).rewards
    for p in range(5):
        k = 6
        solved = sum(correct[p].tolist()) / k
        for i in range(k):
            expected = float(correct[p, i]) - 0.3 * max(solved, 1 / k) * lengths[p, i].item() / 128
            assert rewards[p, i].item() == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------------------------------------
# ShorterBetter: r = α·correct − β·|ℓ − ℓ_SOL|
# ---------------------------------------------------------------------------------------------


def test_shorter_better_rewards_toward_the_sample_optimal_length():
    out = shape(ShorterBetterConfig(alpha=2.0, beta=0.01), groups(
        [[0, 1, 1, 0],          # SOL = 20, the shortest correct; the shorter wrong one is penalised too
         [0, 0, 0, 0],          # none correct: SOL = mean length 25
         [1, 1, 1, 1]],         # SOL = 12, reached by two
        [[5, 20, 30, 50], [10, 20, 30, 40], [12, 12, 18, 30]]))
    close(out.rewards, [[-0.15, 2.0, 1.9, -0.3],
                        [-0.15, -0.05, -0.05, -0.15],
                        [2.0, 2.0, 1.94, 1.82]])
    # penalised: every rollout off its group's SOL, 3 + 4 + 2 of 12; removed .55 + .4 + .24 = 1.19
    assert out.metrics["penalised_frac"] == pytest.approx(9 / 12)
    assert out.metrics["penalty_mean"] == pytest.approx(1.19 / 9)
    assert out.metrics["sol_mean"] == pytest.approx((20 + 25 + 12) / 3)


def test_shorter_better_paper_defaults():
    # α = 2, β = 0.001 on the paper's scale: 2,000 tokens past SOL cost as much as a correct answer earns
    close(shape(ShorterBetterConfig(), groups([[1, 0, 1]], [[1000, 3000, 3000]], cap=6000)).rewards, [[2.0, -2.0, 0.0]])


def test_shorter_better_edge_cases():
    sb = ShorterBetterConfig(beta=0.01)
    close(shape(sb, groups([[1, 1]], [[128, 128]], [[1, 1]], cap=128)).rewards, [[2, 2]])     # all truncated, correct
    close(shape(sb, groups([[0, 0]], [[128, 128]], [[1, 1]], cap=128)).rewards, [[0, 0]])     # all truncated, wrong
    close(shape(sb, groups([[1]], [[40]])).rewards, [[2]])                                    # a group of one
    close(shape(sb, groups([[0]], [[40]])).rewards, [[0]])                                    # SOL = its own length
    # partial credit: α·score, and SOL from the score-1 answers only (SOL = 10)
    close(shape(sb, groups([[1, 0, 0]], [[10, 8, 20]], scores=[[1.0, 0.5, 0.0]])).rewards, [[2.0, 0.98, -0.1]])


def test_shorter_better_matches_a_loop():
    torch.manual_seed(2)
    correct = torch.rand(6, 5) < 0.4
    correct[0] = False
    lengths = torch.randint(1, 129, (6, 5))
    rewards = shape(ShorterBetterConfig(alpha=1.0, beta=0.02), groups(correct.int().tolist(), lengths.tolist(), cap=128)).rewards
    for p in range(6):
        ok = [l for l, c in zip(lengths[p].tolist(), correct[p].tolist()) if c]
        sol = min(ok) if ok else sum(lengths[p].tolist()) / 5
        for i in range(5):
            expected = 1.0 * float(correct[p, i]) - 0.02 * abs(lengths[p, i].item() - sol)
            assert rewards[p, i].item() == pytest.approx(expected, abs=1e-5)

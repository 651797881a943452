"""The field's strongest simple baselines (issue 39): DLER, ALP and ShorterBetter; then LASER and LASER-D.

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
from taut.length.laser import LaserConfig, LaserDConfig, thresholds
from taut.length.shorter_better import ShorterBetterConfig
from taut.rl.advantages import group_advantages
from taut.rl.objectives import build_objective, resolve_adv_norm


def groups(correct, lengths, truncated=None, *, cap=100, scores=None, step=0) -> GroupBatch:
    correct = torch.tensor(correct, dtype=torch.bool)
    return GroupBatch(
        correct=correct,
        lengths=torch.tensor(lengths),
        truncated=torch.zeros_like(correct) if truncated is None else torch.tensor(truncated, dtype=torch.bool),
        step=step, cap=cap,
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
    assert "2505.15612" in REGISTRY["laser"].source and "2505.15612" in REGISTRY["laser-d"].source
    assert by_name["laser"]["defaults"] == {"name": "laser", "alpha": 1 / 3, "target_length": None}
    assert by_name["laser-d"]["defaults"] == {"name": "laser-d", "alpha": 1 / 3, "min_target": None, "interval": None,
                                              "monitor_every": 20, "expected_correct": 1}


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
    with pytest.raises(ConfigError, match="target_length"):
        load_config(None, ["strategy.name=laser", "strategy.target_length=0"])
    for key, bad in (("alpha", "0"), ("min_target", "0"), ("interval", "0"), ("monitor_every", "0"), ("expected_correct", "0")):
        with pytest.raises(ConfigError, match=key):
            load_config(None, ["strategy.name=laser-d", f"strategy.{key}={bad}"])


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
    plan = build_objective(strategy, RLConfig().loss).plan(rewards, batch.lengths.flatten(), cap=100)
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
        ok = [n for n, c in zip(lengths[p].tolist(), correct[p].tolist()) if c]
        sol = min(ok) if ok else sum(lengths[p].tolist()) / 5
        for i in range(5):
            expected = 1.0 * float(correct[p, i]) - 0.02 * abs(lengths[p, i].item() - sol)
            assert rewards[p, i].item() == pytest.approx(expected, abs=1e-5)


# ---------------------------------------------------------------------------------------------
# LASER: r = c + α·1[correct]·1[ℓ ≤ L_T];  LASER-D: L_T per difficulty level, from monitored groups
# ---------------------------------------------------------------------------------------------

THIRD = 1 / 3


def test_laser_step_bonus_within_the_target():
    # α = 1/3, L_T = cap / 4 = 25: correct and ℓ ≤ 25 → 4/3; correct and longer → 1; wrong → 0 at any length
    out = shape(LaserConfig(), groups([[1, 1, 0, 1]], [[20, 25, 10, 60]]))
    close(out.rewards, [[4 * THIRD, 4 * THIRD, 0, 1]])
    assert out.metrics == {"bonus_frac": 0.5, "target_len_mean": 25.0}
    close(shape(LaserConfig(alpha=0.5, target_length=40), groups([[1, 1, 0]], [[40, 41, 5]])).rewards, [[1.5, 1, 0]])


def test_laser_edge_cases():
    close(shape(LaserConfig(), groups([[1, 1]], [[100, 100]], [[1, 1]])).rewards, [[1, 1]])          # all truncated
    close(shape(LaserConfig(target_length=100), groups([[1, 0]], [[100, 100]], [[1, 1]])).rewards, [[4 * THIRD, 0]])
    close(shape(LaserConfig(), groups([[0, 0, 0]], [[1, 2, 3]])).rewards, [[0, 0, 0]])                # none correct
    close(shape(LaserConfig(), groups([[1]], [[3]])).rewards, [[4 * THIRD]])                          # a group of one
    # partial credit is the base; only the score-1 answer earns the bonus
    close(shape(LaserConfig(), groups([[1, 0, 0]], [[10, 10, 10]], scores=[[1.0, 0.5, 0.0]])).rewards, [[4 * THIRD, 0.5, 0]])


def test_laser_alpha_is_the_codes_bonus_on_taut_scale():
    """The released code scores 1 / −0.5 and adds 0.5; on taut's 1 / 0 scale the same group advantages need α = 1/3."""
    lengths = [[10, 30, 20, 50, 5, 70]]
    correct = [[1, 1, 0, 1, 0, 1]]
    ours = shape(LaserConfig(target_length=40), groups(correct, lengths)).rewards
    code = torch.tensor([[1.5, 1.5, -0.5, 1.0, -0.5, 1.0]])
    close(ours, ((code + 0.5) / 1.5).tolist())
    close(group_advantages(ours, "group"), group_advantages(code, "group").tolist())


def test_laser_d_thresholds():
    assert thresholds(128, 32, 8) == [32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128]
    assert thresholds(128, 30, 8)[-3:] == [118, 126, 128]          # not aligned: the cap closes the list
    assert thresholds(128, 200, 8) == [128]
    assert thresholds(16384, 4096, 1024) == list(range(4096, 16384 + 1024, 1024))     # the released L4096 script's


# One batch of three groups of G = 8 at a 128-token cap: thresholds 32, 40, …, 128.
#   high (8/8 correct), n = ⌊16/3⌋ = 5: ⌊5·covered/8⌋ ≥ 1 needs 2 rollouts within T → T = 40 (34, 36)
#   medium (4/8),       n = ⌊8/3⌋ = 2:  needs 4 within T → the 4th shortest is 50 → T = 56
#   low (1/8),          n = 1:          needs all 8 within T → the longest is 120 → T = 120
LASER_D_BATCH = (
    [[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 0, 1, 0], [1, 0, 0, 0, 0, 0, 0, 0]],
    [[34, 36, 41, 44, 50, 60, 70, 80], [30, 35, 45, 50, 55, 60, 90, 100], [20, 30, 40, 50, 60, 70, 80, 120]],
)


def test_laser_d_targets_per_difficulty_level():
    strategy = build_strategy(LaserDConfig())
    out = strategy.shape(groups(*LASER_D_BATCH, cap=128))
    b = 4 * THIRD
    close(out.rewards, [[b, b, 1, 1, 1, 1, 1, 1],            # high, L = 40
                        [b, b, 0, 0, b, 0, 1, 0],            # medium, L = 56: 90 is too long
                        [b, 0, 0, 0, 0, 0, 0, 0]])           # low, L = 120
    assert out.metrics == {"bonus_frac": 0.25, "target_len_mean": 72.0,
                           "target_len_low": 120.0, "target_len_medium": 56.0, "target_len_high": 40.0}
    assert strategy.state_dict() == {"targets": {"low": 120, "medium": 56, "high": 40}, "next_refresh": 20,
                                     "pooled": {"low": [], "medium": [], "high": []}}


def test_laser_d_level_without_monitored_groups_gets_the_cap():
    out = shape(LaserDConfig(), groups([[1, 1, 1, 1]], [[10, 20, 30, 128]], cap=128))
    # high: n = ⌊8/3⌋ = 2 needs 2 of 4 within T → T = 32, which 3 reach; low and medium were not monitored → the cap
    assert (out.metrics["target_len_high"], out.metrics["target_len_medium"], out.metrics["target_len_low"]) == (32, 128, 128)
    close(out.rewards, [[4 * THIRD, 4 * THIRD, 4 * THIRD, 1]])


def test_laser_d_training_and_monitor_levels_split_at_thirds_as_the_code():
    """G = 3: 2 of 3 correct is `high` for the reward (p ≥ 2/3) but `medium` for the monitor (p ≤ 2/3);
    1 of 3 is `medium` for the reward (p ≥ 1/3) and `low` for the monitor (p ≤ 1/3)."""
    strategy = build_strategy(LaserDConfig())
    strategy.load_state_dict({"targets": {"low": 30, "medium": 20, "high": 10}, "next_refresh": 100, "pooled": {}})
    out = strategy.shape(groups([[1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]],
                                [[10, 15, 5], [20, 1, 1], [21, 1, 1], [1, 1, 1]], cap=128))
    close(out.rewards, [[4 * THIRD, 1, 0], [4 * THIRD, 0, 0], [1, 0, 0], [0, 0, 0]])
    assert out.metrics["target_len_mean"] == pytest.approx((10 + 20 + 20 + 30) / 4)
    assert strategy.state_dict()["pooled"] == {"low": [20, 1, 1, 21, 1, 1, 1, 1, 1], "medium": [10, 15, 5], "high": []}


# G = 4 at a 64-token cap, min_target 16, interval 8: thresholds 16, 24, …, 64; n = 1 (low), 1 (medium), 2 (high).
STEP0 = ([[1, 1, 1, 1]], [[10, 20, 30, 40]])               # high: 2 within 24 → L_high = 24
STEP1 = ([[1, 1, 1, 1]], [[8, 8, 50, 60]])                 # pooled (high), shaped with L_high = 24
STEP1_AGAIN = ([[0, 0, 0, 1]], [[12, 40, 50, 60]])         # a second round of step 1 (dynamic sampling), low
STEP2 = ([[1, 1, 0, 0]], [[20, 30, 40, 50]])               # refresh from step 1's groups and this one (medium)
STEP3 = ([[1, 1, 1, 1]], [[16, 17, 10, 30]])


def run_laser_d(strategy, batches):
    return [strategy.shape(groups(c, n, cap=64, step=s)) for s, (c, n) in batches]


def test_laser_d_refreshes_targets_every_monitor_every_steps():
    strategy = build_strategy(LaserDConfig(min_target=16, interval=8, monitor_every=2))
    b = 4 * THIRD
    out = run_laser_d(strategy, [(0, STEP0), (1, STEP1), (1, STEP1_AGAIN), (2, STEP2), (3, STEP3)])
    close(out[0].rewards, [[b, b, 1, 1]])
    close(out[1].rewards, [[b, b, 1, 1]])                  # the step-0 target 24 still holds
    close(out[2].rewards, [[0, 0, 0, b]])                  # low: not monitored yet → the cap
    # step 2 refreshes from the pool: high [8, 8, 50, 60] → 16; low [12, 40, 50, 60] → 64 (all within);
    # medium [20, 30, 40, 50] (n = 1: all within) → 56
    assert [out[3].metrics[f"target_len_{k}"] for k in ("low", "medium", "high")] == [64, 56, 16]
    close(out[3].rewards, [[b, b, 0, 0]])
    close(out[4].rewards, [[b, 1, b, 1]])                  # step 3: no refresh, high target 16
    assert strategy.state_dict()["next_refresh"] == 4


def test_laser_d_restored_strategy_shapes_the_same():
    config = LaserDConfig(min_target=16, interval=8, monitor_every=2)
    steps = [(0, STEP0), (1, STEP1), (1, STEP1_AGAIN), (2, STEP2), (3, STEP3)]
    for cut in range(1, len(steps)):
        original = build_strategy(config)
        run_laser_d(original, steps[:cut])
        restored = build_strategy(config)
        restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
        assert restored.state_dict() == original.state_dict()
        for a, b in zip(run_laser_d(original, steps[cut:]), run_laser_d(restored, steps[cut:])):
            assert torch.equal(a.rewards, b.rewards) and a.metrics == b.metrics
    restored.load_state_dict({})                           # a phase that starts afresh
    assert restored.state_dict() == {"targets": {}, "next_refresh": 0, "pooled": {"low": [], "medium": [], "high": []}}


def _released_laser_d(correct, lengths, length_thresholds, n_rollout=8, expected_n_correct=1, scalar=0.5):
    """hkust-nlp/Laser's larse-d reward, near-literally, with the training groups as the monitor set:
    `_count_accuracy_bands_metrics` + `_calculate_length_coverage_statistics` (ray_trainer.py),
    `_choose_target_length` (floor) and `compute_length_reward_larse_d` (length_penalty.py)."""
    lengths_by_band = {"low": [], "medium": [], "high": []}
    for c, group in zip(correct, lengths):
        accuracy = sum(c) / len(c)
        band = "low" if accuracy <= 1 / 3 else "medium" if accuracy <= 2 / 3 else "high"
        lengths_by_band[band].extend(group)
    max_response_length = max(max(group) for group in lengths)
    target_lengths = {}
    for level in ("low", "medium", "high"):
        target_lengths[level] = max_response_length
        for length in length_thresholds:
            band = lengths_by_band[level]
            ratio = sum(1 for x in band if x <= length) / len(band) if band else 0.0
            lower_n = int(n_rollout * 2 / 3) if level == "high" else int(n_rollout * 1 / 3) if level == "medium" else 1
            if int(ratio * lower_n) >= expected_n_correct and length < target_lengths[level]:
                target_lengths[level] = length
    scores = []
    for c, group in zip(correct, lengths):
        acc = sum(c) / len(c)
        target = target_lengths["high"] if acc >= 2 / 3 else target_lengths["medium"] if acc >= 1 / 3 else target_lengths["low"]
        scores.append([(1.0 + (scalar if n <= target else 0.0)) if ok else -0.5 for ok, n in zip(c, group)])
    return scores


@pytest.mark.parametrize("seed", range(4))
def test_laser_d_matches_the_released_code(seed):
    """At the released L4096 script's scale (cap 16,384, thresholds 4,096 … 16,384 every 1,024, G = 8), the
    first step's rewards are the code's mapped to taut's scale by (x + 0.5) / 1.5."""
    gen = torch.Generator().manual_seed(seed)
    rates = torch.rand(12, 1, generator=gen)
    correct = (torch.rand(12, 8, generator=gen) < rates).int().tolist()
    lengths = torch.randint(500, 16385, (12, 8), generator=gen).tolist()
    ours = shape(LaserDConfig(), groups(correct, lengths, cap=16384)).rewards
    code = torch.tensor(_released_laser_d(correct, lengths, list(range(4096, 16384 + 1024, 1024))))
    close(ours, ((code + 0.5) / 1.5).tolist())

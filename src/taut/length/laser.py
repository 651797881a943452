"""`laser` and `laser-d`: Length-bAsed StEp Reward shaping (Liu et al., "Learn to Reason
Efficiently with Adaptive Length-based Reward Shaping", arXiv 2505.15612).

LASER adds a step bonus to a correct rollout that stays within a target length L_T. In the
paper's unified form R̂(x, y) = C(y) + λ(y)·S(y), C is the correctness reward, λ(y) = 1[correct]
and S(y) = α·1[ℓ(y) ≤ L_T]:

    r_i = c_i + α · 1[correct_i] · 1[ℓ_i ≤ L_T]

Wrong rollouts get no bonus and no penalty, whatever their length. LASER-D ("Dynamic and
Difficulty-aware") keeps this reward but gives each prompt the target of its difficulty level,
and moves the three targets as training goes:

    level of a group      by its pass rate p = k/G (k correct of G):
                          high if p ≥ 2/3, medium if 1/3 ≤ p < 2/3, low if p < 1/3
    r_i                   = c_i + α · 1[correct_i] · 1[ℓ_i ≤ L_level]

The targets are chosen from monitoring rollouts, every `monitor_every` steps. The monitored
groups are put into the three levels as well. Here the boundaries are p ≤ 1/3 low, 1/3 < p ≤ 2/3
medium, p > 2/3 high; the two bucketings disagree only when 3k is a multiple of G, never with
G = 8. For each level d, over the rollouts R_d of the monitored groups of that level:

    thresholds        T ∈ {m, m + Δ, m + 2Δ, …} below the cap, then the cap
    coverage          P_d(T) = |{r ∈ R_d : ℓ_r ≤ T}| / |R_d|        (every rollout, right or wrong)
    expected correct  ECR_d(T) = ⌊P_d(T) · n_d⌋,   n_high = ⌊2G/3⌋, n_medium = ⌊G/3⌋, n_low = 1
    target            L_d = min { T : ECR_d(T) ≥ e }                 (e = 1 expected correct response)
                          = the cap when no T qualifies (a level with no monitored group)

n_d is the least number of correct rollouts a group of that level has. A target is the shortest
length at which such a group still expects e correct rollouts within it. The targets are tight for
easy prompts and loose for hard ones: a low-level target must cover every monitored rollout of
its level (n_low = 1), a high-level one only a fifth of them when G = 8 (n_high = 5).

Where it was read:
- The unified framework, LASER's step reward and LASER-D's difficulty levels come from the
  abstract and the paper, arXiv 2505.15612 (https://arxiv.org/abs/2505.15612, HTML
  https://arxiv.org/html/2505.15612v1). We could read the abstract and transcriptions of the
  framework (https://www.themoonlight.io/en/review/learn-to-reason-efficiently-with-adaptive-length-based-reward-shaping),
  but not the method section itself.
- The formulas above come from the official code, github.com/hkust-nlp/Laser. In
  `verl/utils/reward_score/length_penalty.py`, `compute_length_reward_larse` is LASER and
  `compute_length_reward_larse_d` is LASER-D (the bonus, the training levels at 1/3 and 2/3).
  `_choose_target_length` picks the targets (n_d, ⌊·⌋, `expected_n_correct` = 1).
  `verl/trainer/ppo/ray_trainer.py` (`_count_accuracy_bands_metrics`,
  `_calculate_length_coverage_statistics`) buckets the monitored groups and counts coverage over
  all of their rollouts. `verl/utils/reward_score/constants.py` (`get_length_threshold`) builds
  the thresholds.
- The settings come from `scripts/training/laser-d-1.5b/laser-d-1.5b-l4096.sh`:
  `length_reward_scalar=0.5`, thresholds 4,096 to 16,384 every 1,024 (the 16,384-token cap is the
  upper bound), `monitor_freq=20`, a monitor set of 500 training problems
  (`train_sample500.parquet`), 8 rollouts per prompt and `adv_estimator=grpo`. The LASER scripts
  use L_T = 2,048, 4,096 or 8,192 with the same scalar.

α on taut's scale. The code's verifier (`hf_math_verifier.compute_score`) scores a correct
answer 1 and a wrong one −0.5, and the bonus is 0.5. A correct rollout within its target
therefore scores 1.5. taut scores a correct answer 1 and a wrong one 0. The map x ↦ (x + 0.5)/1.5
takes the code's rewards to taut's, and under GRPO's group normalisation it leaves the advantages
unchanged. On taut's scale the code's bonus is α = 0.5/1.5 = 1/3, the default here. The strategy
declares no advantage normalisation, so the trainer uses GRPO's group std, as the code does.

Our reading:
- The monitor. The code runs a separate generation pass every 20 steps: G rollouts for each of
  500 fixed training problems, plus one before the first step. A strategy sees only the training
  groups, so the monitored groups here are the training groups themselves. These are every group
  shaped since the last refresh, including groups that dynamic sampling later drops, plus the
  current batch. The targets are refreshed on the first batch of a phase (from that batch alone,
  as the code's monitor before step 1 sees the initial policy) and on the first batch at least
  `monitor_every` steps after the last refresh. Between refreshes they stay fixed. The current
  targets, the next refresh step and the pooled rollout lengths of each level are kept in
  `state_dict`, so a resumed run shapes exactly as an uninterrupted one.
- The minimum threshold m and the step Δ default to a quarter and a sixteenth of the rollout cap
  (4,096 and 1,024 of the code's 16,384: its Laser-D-L4096). The code's `get_length_threshold`
  switches to steps from 1,024 when m < 1,024, which has no meaning at a 128-token cap. It is not
  kept: the thresholds are m, m + Δ, … below the cap, then the cap.
- When no threshold qualifies, the code falls back to the longest response of the current
  training batch. The fallback here is the cap. Every rollout is within either, so the rewards
  are the same, and only the logged target differs.
- ⌊P_d(T)·n_d⌋ is computed in integers, ⌊|covered|·n_d / |R_d|⌋. The code computes it in floats.
- The code's verifier also scores −1 for a response with no think delimiters or no \\boxed answer,
  which includes nearly every truncated one. That is that verifier's format rule, not LASER's.
  Here a truncated rollout is graded by the task's verifier like any other, and its length is the
  cap.
- With partial credit (reasoning-gym tasks), the base reward is the score. The bonus, the pass
  rate and the levels count only score-1 answers.
- Not implemented: the code's `length_reward_type` "penalty" and "hybrid" variants, which no
  script uses; its `round_method=ceil`; and LASER-DE. LASER-DE also gives the bonus to wrong
  rollouts longer than the target that do not end in token n-gram repetition. That test needs the
  tokens, which a `GroupBatch` does not carry.

Metrics: bonus_frac (share of rollouts given the bonus) and target_len_mean (mean target over the
step's groups). `laser-d` also logs target_len_low, target_len_medium and target_len_high, the
current targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from taut.lazy import lazy_module
from taut.length.base import GroupBatch, Shaped, Strategy, correctness
from taut.schema import Strict

torch = lazy_module("torch")     # loaded on first use: a recipe validates without it (taut.lazy)

if TYPE_CHECKING:
    from torch import Tensor

LEVELS = ("low", "medium", "high")


class LaserConfig(Strict):
    name: Literal["laser"] = "laser"
    alpha: float = Field(1 / 3, gt=0, description="α: bonus of a correct rollout within L_T (the code's 0.5 on its 1 / −0.5 scale, "
                                                  "i.e. 1/3 on taut's 1 / 0 scale)")
    target_length: int | None = Field(None, gt=0, description="L_T in tokens; default: a quarter of the step's rollout cap "
                                                              "(the code's 4,096 of 16,384; our reading)")


class LaserDConfig(Strict):
    name: Literal["laser-d"] = "laser-d"
    alpha: float = Field(1 / 3, gt=0, description="α: bonus of a correct rollout within its level's target (the code's 0.5 "
                                                  "on its 1 / −0.5 scale, i.e. 1/3 on taut's 1 / 0 scale)")
    min_target: int | None = Field(None, gt=0, description="m, the smallest target in tokens; default: a quarter of the rollout "
                                                           "cap (the code's 4,096 of 16,384; our reading)")
    interval: int | None = Field(None, gt=0, description="Δ, the step between targets in tokens; default: a sixteenth of the "
                                                         "rollout cap (the code's 1,024 of 16,384; our reading)")
    monitor_every: int = Field(20, ge=1, description="steps between target refreshes (the code's monitor_freq)")
    expected_correct: int = Field(1, ge=1, description="e: correct rollouts a target must leave room for (the code's "
                                                       "expected_n_correct)")


def laser_rewards(base: Tensor, correct: Tensor, lengths: Tensor, target: Tensor | int, alpha: float) -> tuple[Tensor, Tensor]:
    """Shaped rewards [P, G] and the bonus mask [P, G]: base + α where correct and ℓ ≤ target
    (`target` an int or [P, 1])."""
    bonus = correct & (lengths <= target)
    return base + alpha * bonus.float(), bonus


def difficulty_levels(correct: Tensor, *, monitor: bool = False) -> list[str]:
    """Each group's level by its pass rate k/G. For the reward: high ≥ 2/3 > medium ≥ 1/3 > low;
    for the monitor (`monitor`), the code's other side of each boundary: low ≤ 1/3 < medium ≤ 2/3 < high."""
    g = correct.shape[1]
    above = (lambda k, b: 3 * k > b) if monitor else (lambda k, b: 3 * k >= b)    # noqa: E731
    return ["high" if above(k, 2 * g) else "medium" if above(k, g) else "low" for k in correct.sum(dim=1).tolist()]


def thresholds(cap: int, min_target: int, interval: int) -> list[int]:
    """Candidate targets: m, m + Δ, … below the cap, then the cap."""
    return [*range(min_target, cap, interval), cap]


def choose_targets(pooled: dict[str, list[int]], candidates: list[int], group_size: int, expected: int,
                   fallback: int) -> dict[str, int]:
    """Each level's target: the smallest candidate T with ⌊coverage(T) · n_level⌋ ≥ `expected`,
    coverage over all the level's monitored rollout lengths; `fallback` when none qualifies."""
    least_correct = {"low": 1, "medium": group_size // 3, "high": 2 * group_size // 3}
    targets = {}
    for level in LEVELS:
        lengths = pooled[level]
        targets[level] = fallback
        for t in sorted(candidates):
            covered = sum(n <= t for n in lengths)
            if lengths and covered * least_correct[level] // len(lengths) >= expected:
                targets[level] = t
                break
    return targets


class Laser(Strategy):
    name = "laser"

    def __init__(self, config: LaserConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        target = self.config.target_length if self.config.target_length is not None else max(1, batch.cap // 4)
        rewards, bonus = laser_rewards(correctness(batch), batch.correct, batch.lengths, target, self.config.alpha)
        return Shaped(rewards, {"bonus_frac": bonus.float().mean().item(), "target_len_mean": float(target)})


class LaserD(Strategy):
    name = "laser-d"

    def __init__(self, config: LaserDConfig):
        self.config = config
        self.load_state_dict({})

    def shape(self, batch: GroupBatch) -> Shaped:
        self._monitor(batch)
        levels = difficulty_levels(batch.correct)
        target = torch.tensor([[self.targets[level]] for level in levels])                     # [P, 1]
        rewards, bonus = laser_rewards(correctness(batch), batch.correct, batch.lengths, target, self.config.alpha)
        metrics = {
            "bonus_frac": bonus.float().mean().item(),
            "target_len_mean": target.float().mean().item(),
            **{f"target_len_{level}": float(self.targets[level]) for level in LEVELS},
        }
        return Shaped(rewards, metrics)

    def _monitor(self, batch: GroupBatch) -> None:
        """Pool this batch's rollouts by monitor level; refresh the targets when one is due."""
        for level, lengths in zip(difficulty_levels(batch.correct, monitor=True), batch.lengths.tolist()):
            self.pooled[level] += [int(n) for n in lengths]
        if self.targets and batch.step < self.next_refresh:
            return
        c = self.config
        m = c.min_target if c.min_target is not None else max(1, batch.cap // 4)
        step = c.interval if c.interval is not None else max(1, batch.cap // 16)
        self.targets = choose_targets(self.pooled, thresholds(batch.cap, m, step), batch.correct.shape[1],
                                      c.expected_correct, fallback=batch.cap)
        self.next_refresh = batch.step + c.monitor_every
        self.pooled = {level: [] for level in LEVELS}

    def state_dict(self) -> dict[str, Any]:
        return {"targets": dict(self.targets), "next_refresh": self.next_refresh,
                "pooled": {level: list(lengths) for level, lengths in self.pooled.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the targets and the monitor pool; an empty state (a phase that starts afresh) clears them."""
        state = state or {}
        self.targets: dict[str, int] = {str(k): int(v) for k, v in state.get("targets", {}).items()}
        self.next_refresh: int = int(state.get("next_refresh", 0))
        pooled = state.get("pooled", {})
        self.pooled: dict[str, list[int]] = {level: [int(n) for n in pooled.get(level, [])] for level in LEVELS}

"""`shorter-better`: ShorterBetter (Yi, Wang & Li, arXiv 2504.21370).

Each rollout is rewarded toward the group's Sample Optimal Length (SOL). For the n = G rollouts
of a prompt:

    ℓ_SOL = min { ℓ_j : correct_j }       when at least one rollout is correct
          = (1/n) · Σ_j ℓ_j               otherwise (the mean length of the group)
    r_i   = α · 1[correct_i] − β · |ℓ_i − ℓ_SOL|

The length term applies to every rollout, correct or not, and in both directions: a rollout
shorter than ℓ_SOL is penalised too. The paper optimises this reward with GRPO, so the strategy
declares no advantage normalisation and the trainer uses the group std.

Where it was read:
- The formula and ℓ_SOL's two cases: arXiv 2504.21370 (https://arxiv.org/html/2504.21370v4) and
  its transcription at https://newfacade.github.io/notes-on-llm/reasoning/shorter-better.html.
- α, β and the length unit: the official code, github.com/JingyangYi/ShorterBetter.
  `verl/verl/workers/reward_manager/naive.py` (`sb_compute_score`) sets α = 2.0 and β = 0.001,
  takes the length in response tokens (the attention mask, so <eos> is counted) and grades the
  text whatever its length.
- The training settings: `scripts/train/sb_1.5B.sh` trains GRPO with 12 rollouts per prompt and
  a 6,000-token cap.

The paper reports models trained with α = 1 and α = 2. The defaults here are the code's, α = 2
and β = 0.001. The recipe scales β to the testbed's 128-token cap.

Our reading. When the grader gives partial credit (reasoning-gym tasks), the correctness term
is α times the score, and ℓ_SOL is taken over the rollouts with score 1. The paper's reward is
binary. A truncated rollout is graded by the task's verifier, and its length is the cap.

Metrics: penalised_frac and penalty_mean (reward below α·1[correct], i.e. ℓ_i ≠ ℓ_SOL), and
sol_mean, the mean ℓ_SOL over the batch's groups.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from taut.lazy import lazy_module
from taut.length.base import GroupBatch, Shaped, Strategy, correctness, penalty_metrics
from taut.schema import Strict

torch = lazy_module("torch")     # loaded on first use: a recipe validates without it (taut.lazy)

if TYPE_CHECKING:
    from torch import Tensor


class ShorterBetterConfig(Strict):
    name: Literal["shorter-better"] = "shorter-better"
    alpha: float = Field(2.0, gt=0, description="α: reward of a correct answer (the official code's 2; the paper reports 1 and 2)")
    beta: float = Field(0.001, gt=0, description="β: penalty per token of |ℓ − ℓ_SOL| (the official code's 0.001, for rollouts of up to 6,000 tokens)")


def sample_optimal_length(correct: Tensor, lengths: Tensor) -> Tensor:
    """ℓ_SOL per group, [P, 1]: the shortest correct length, or the mean length when none is correct."""
    length = lengths.float()
    shortest_correct = torch.where(correct, length, torch.full_like(length, float("inf"))).amin(dim=1, keepdim=True)
    return torch.where(correct.any(dim=1, keepdim=True), shortest_correct, length.mean(dim=1, keepdim=True))


class ShorterBetter(Strategy):
    name = "shorter-better"

    def __init__(self, config: ShorterBetterConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        c = self.config
        sol = sample_optimal_length(batch.correct, batch.lengths)                            # [P, 1]
        base = c.alpha * correctness(batch)
        rewards = base - c.beta * (batch.lengths.float() - sol).abs()
        return Shaped(rewards, {**penalty_metrics(base, rewards), "sol_mean": sol.mean().item()})

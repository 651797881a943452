"""`alp`: Adaptive Length Penalty (Xiang et al., "Just Enough Thinking", arXiv 2506.05256).

A per-token length penalty whose weight is the prompt's online solve rate. Easy prompts pay
for every token; prompts the model rarely solves pay little. For the K = G rollouts of a prompt:

    p_solved = (1/K) · Σ_k 1[correct_k]                 the group's pass rate
    r_i      = 1[correct_i] − β · max(p_solved, 1/K) · ℓ_i / N

The penalty applies to every rollout, correct or not. The 1/K floor keeps some pressure on
prompts that no rollout solved. β > 0 is the global coefficient and N a normalisation constant.

Where it was read. The paper's abstract is at https://arxiv.org/abs/2506.05256 (HTML
https://arxiv.org/html/2506.05256v2). We could not read the method section directly. The reward
above is the one transcribed in two independent summaries of it
(https://www.themoonlight.io/en/review/just-enough-thinking-efficient-reasoning-with-adaptive-length-penalties-reinforcement-learning
and its Korean edition): "1[answer(y) = y*] − (β/N) · max(p_solved(q), K⁻¹) · |y|, N a
normalization constant, β > 0 a global coefficient". No official code was found.

Our reading:
- N is the rollout cap of the step, unless `normalizer` sets it. The paper leaves N as "a
  normalization constant". With N the cap, β is the penalty of a rollout of a solved prompt that
  runs to the cap. prime-rl's pass-rate-scaled linear length penalty (PrimeIntellect-ai/prime-rl
  #2829) divides by the sequence length the same way.
- The default β = 0.5 is ours; we found no value for this form of the reward. A third-party
  note gives β = 1e-7, which only fits a penalty that is not divided by N, and one summary
  renders the formula as β·N·max(·). Where N goes is therefore also our reading.
- ℓ_i counts response tokens, <eos> included. A truncated rollout is graded by the task's
  verifier like any other, and its length is the cap.
- The paper trains with GRPO, RLOO or Reinforce++. The strategy declares no advantage
  normalisation, so the trainer uses the group std. With it, β and p_solved cancel in any group
  whose rollouts are all correct or all wrong, where only the ordering by length is left. They
  take effect in mixed groups, where they weigh length against correctness.

Metrics: penalised_frac and penalty_mean (every rollout with ℓ > 0 is penalised).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from taut.length.base import GroupBatch, Shaped, Strategy, correctness, penalty_metrics
from taut.schema import Strict

if TYPE_CHECKING:
    from torch import Tensor


class AlpConfig(Strict):
    name: Literal["alp"] = "alp"
    beta: float = Field(0.5, gt=0, description="β: penalty of a solved prompt's rollout at length N (ours; the paper's value for this form is not known)")
    normalizer: int | None = Field(None, gt=0, description="N in tokens; default: the step's rollout cap (our reading)")


def alp_penalty(correct: Tensor, lengths: Tensor, beta: float, normalizer: int) -> Tensor:
    """β · max(p_solved, 1/K) · ℓ / N, [P, G]."""
    k = correct.shape[1]
    weight = correct.float().mean(dim=1, keepdim=True).clamp(min=1.0 / k)                   # [P, 1]
    return beta * weight * lengths.float() / normalizer


class Alp(Strategy):
    name = "alp"

    def __init__(self, config: AlpConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        n = batch.cap if self.config.normalizer is None else self.config.normalizer
        base = correctness(batch)
        rewards = base - alp_penalty(batch.correct, batch.lengths, self.config.beta, n)
        return Shaped(rewards, penalty_metrics(base, rewards))

"""`sigmoid` (Arora & Zanette, arXiv 2502.04463) and `grpo-lambda` (arXiv 2505.18086).

sigmoid — for every prompt, with mean μ and standard deviation σ of the lengths of its
*correct* rollouts:

    r_i = 1[correct_i] · (1 − α · sigmoid((ℓ_i − μ) / (σ + 1e-7)))

α ∈ {0.05, 0.1, 0.2, 0.4} in the paper; 0.1 is the official code's default and ours. The paper
optimises it with PPO and the RLOO advantage r_i − mean_{j≠i} r_j, *without* std normalisation;
advantage normalisation `none` gives r_i − mean_j r_j, the same up to the factor G/(G−1); the
strategy declares it, so the trainer uses it unless `rl.adv_norm` overrides it (with a warning).
Departures: σ is the population std (the paper does not say which; + 1e-7 as
in the official code); the official code can score a response without EOS as 0
(`check_eos`), whereas here a truncated rollout is graded by the task's verifier like any other.

grpo-lambda — rank the groups of the batch by correctness ratio; the top-λ fraction
(ceil(λ·P) groups, ties broken by batch order) get the sigmoid reward above, the others the
plain correctness reward; then standard GRPO advantages *with* std normalisation (declared by
the strategy, like sigmoid's). λ = 0.2 is
the paper's example; α = 0.6 comes from third-party code, not the paper, whose α is not
public. The batch ranked is the one the trainer shapes at once (one sampling round).

Metrics: penalised_frac and penalty_mean (reward below 1[correct]); grpo-lambda also logs
gate_open, the share of groups selected for the penalty.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from taut.lazy import lazy_module
from taut.length.base import GroupBatch, Shaped, Strategy, correctness, penalty_metrics
from taut.schema import Strict

torch = lazy_module("torch")     # loaded on first use: a recipe validates without it (taut.lazy)

if TYPE_CHECKING:
    from torch import Tensor


class SigmoidConfig(Strict):
    name: Literal["sigmoid"] = "sigmoid"
    alpha: float = Field(0.1, gt=0, lt=1)


class GrpoLambdaConfig(Strict):
    name: Literal["grpo-lambda"] = "grpo-lambda"
    fraction: float = Field(0.2, gt=0, le=1, description="λ: share of groups, by correctness ratio, that get the penalty")
    alpha: float = Field(0.6, gt=0, lt=1)


def sigmoid_rewards(correct: Tensor, lengths: Tensor, alpha: float) -> Tensor:
    """Arora & Zanette's reward, [P, G]; wrong rollouts score 0."""
    c = correct.float()
    length = lengths.float()
    n = c.sum(dim=1, keepdim=True).clamp(min=1)
    mean = (c * length).sum(dim=1, keepdim=True) / n
    std = ((c * (length - mean) ** 2).sum(dim=1, keepdim=True) / n).sqrt()
    return c * (1 - alpha * torch.sigmoid((length - mean) / (std + 1e-7)))


class Sigmoid(Strategy):
    name = "sigmoid"
    adv_norm = "none"

    def __init__(self, config: SigmoidConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        rewards = sigmoid_rewards(batch.correct, batch.lengths, self.config.alpha)
        return Shaped(rewards, penalty_metrics(correctness(batch), rewards))


class GrpoLambda(Strategy):
    name = "grpo-lambda"
    adv_norm = "group"

    def __init__(self, config: GrpoLambdaConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        selected = top_groups(batch.correct, self.config.fraction)                # [P]
        base = correctness(batch)
        shaped = sigmoid_rewards(batch.correct, batch.lengths, self.config.alpha)
        rewards = torch.where(selected.unsqueeze(1), shaped, base)
        return Shaped(rewards, {"gate_open": selected.float().mean().item(), **penalty_metrics(base, rewards)})


def top_groups(correct: Tensor, fraction: float) -> Tensor:
    """[P] bool: the ceil(λ·P) groups with the highest correctness ratio, ties in batch order."""
    n_groups = correct.shape[0]
    ratio = correct.float().mean(dim=1).tolist()
    order = sorted(range(n_groups), key=lambda i: -ratio[i])       # stable: ties keep batch order
    selected = torch.zeros(n_groups, dtype=torch.bool)
    selected[order[: math.ceil(round(fraction * n_groups, 9))]] = True     # round: 0.28·25 is 7.000000000000001
    return selected

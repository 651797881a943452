"""`sigmoid` (Arora & Zanette, arXiv 2502.04463) and `grpo-lambda` (arXiv 2505.18086).

sigmoid — for every prompt, with mean μ and standard deviation σ of the lengths of its
*correct* rollouts (population std, + 1e-7 as in the official code):

    r_i = 1[correct_i] · (1 − α · sigmoid((ℓ_i − μ) / (σ + 1e-7)))

The paper optimises it with an RLOO advantage *without* std normalisation; its recipe sets
`rl.adv_norm: none`. α ∈ {0.05, 0.1, 0.2, 0.4} in the paper; code default 0.1.

grpo-lambda — rank the groups of the batch by correctness ratio; the top-λ fraction
(ceil(λ·P) groups, ties broken by batch order) get the sigmoid reward above, the others the
plain correctness reward; then standard GRPO advantages *with* std normalisation. λ = 0.2 is
the paper's example; α = 0.6 comes from third-party code, not the paper (methods.md §3e).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from taut.length.base import GroupBatch, Shaped, Strategy, correctness
from taut.schema import Strict


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

    def __init__(self, config: SigmoidConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        rewards = sigmoid_rewards(batch.correct, batch.lengths, self.config.alpha)
        penalty = correctness(batch) - rewards
        return Shaped(rewards, {"penalty_mean": penalty[batch.correct].mean().item() if batch.correct.any() else 0.0})


class GrpoLambda(Strategy):
    name = "grpo-lambda"

    def __init__(self, config: GrpoLambdaConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        n_groups = batch.correct.shape[0]
        ratio = batch.correct.float().mean(dim=1)
        k = math.ceil(self.config.fraction * n_groups)
        order = sorted(range(n_groups), key=lambda i: -ratio[i].item())   # stable: ties keep batch order
        selected = torch.zeros(n_groups, dtype=torch.bool)
        selected[order[:k]] = True
        shaped = sigmoid_rewards(batch.correct, batch.lengths, self.config.alpha)
        rewards = torch.where(selected.unsqueeze(1), shaped, correctness(batch))
        return Shaped(rewards, {"gate_open": selected.float().mean().item(),
                                "penalty_mean": (correctness(batch) - rewards)[selected.unsqueeze(1) & batch.correct].mean().item()
                                if (selected.unsqueeze(1) & batch.correct).any() else 0.0})

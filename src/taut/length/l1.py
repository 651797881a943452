"""`l1-exact`, `l1-max`: a token budget written into the prompt, rewarded on the deviation.

Source: L1 / LCPO, arXiv 2503.04697. Each prompt gets a budget n_gold ~ Uniform[n_min, n_max]
written into it ("Think for n_gold tokens."; the testbed writes `budget D D` before `<think>`):

    l1-exact   r_i = 1[correct_i] − α · |n_gold − ℓ_i|
    l1-max     r_i = 1[correct_i] · clip(α · (n_gold − ℓ_i) + δ, 0, 1)

The paper uses α = 0.0003 with budgets of 100–4000 tokens; testbed responses are 4–100 tokens,
so the defaults scale α up (0.01). The paper trains l1-max starting from an l1-exact model and
does not give its α; chain the two as phases to follow it. The paper's max-mode prompt wording is
not public either: both modes write the same `budget D D` words, and only the reward differs.
Budgets are drawn per prompt, uniformly over the integers n_min..n_max inclusive. Metrics:
penalised_frac, penalty_mean (reward below 1[correct]), budget_mean, budget_abs_error (mean
|n_gold − ℓ|).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from taut.length.base import GroupBatch, Shaped, Strategy, correctness, penalty_metrics
from taut.schema import Strict


class L1ExactConfig(Strict):
    name: Literal["l1-exact"] = "l1-exact"
    n_min: int = Field(8, gt=0)
    n_max: int = Field(96, gt=0)
    alpha: float = Field(0.01, gt=0)

    @model_validator(mode="after")
    def _order(self):
        if self.n_min > self.n_max:
            raise ValueError(f"n_min ({self.n_min}) must not exceed n_max ({self.n_max})")
        return self


class L1MaxConfig(L1ExactConfig):
    name: Literal["l1-max"] = "l1-max"
    delta: float = Field(0.5, ge=0, le=1)


class L1(Strategy):
    name = "l1-exact"

    def __init__(self, config: L1ExactConfig):
        self.config = config
        self.name = config.name

    def budget(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.config.n_min, self.config.n_max + 1))

    def shape(self, batch: GroupBatch) -> Shaped:
        if batch.budgets is None:
            raise ValueError(f"{self.name} needs the prompt budgets in the batch")
        gold = batch.budgets.float().unsqueeze(1)              # [P, 1]
        length = batch.lengths.float()                         # [P, G]
        c = correctness(batch)
        if isinstance(self.config, L1MaxConfig):
            rewards = c * (self.config.alpha * (gold - length) + self.config.delta).clamp(0.0, 1.0)
        else:
            rewards = c - self.config.alpha * (gold - length).abs()
        return Shaped(rewards, {**penalty_metrics(c, rewards), "budget_mean": gold.mean().item(),
                                "budget_abs_error": (gold - length).abs().mean().item()})

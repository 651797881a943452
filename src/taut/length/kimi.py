"""`kimi`: the group min/max length reward of Kimi k1.5 (arXiv 2501.12599, §2.3.3).

Over the G rollouts of one prompt, with ℓ_min and ℓ_max the shortest and longest:

    λ_i = 0.5 − (ℓ_i − ℓ_min) / (ℓ_max − ℓ_min)        (λ_i = 0 for all when ℓ_max = ℓ_min)
    len_i = λ_i if correct_i else min(0, λ_i)
    r_i = 1[correct_i] + w · len_i

The paper does not give the weight w (default here 0.5) nor when its warm-up without the
penalty ends; run it as a phase after an accuracy phase to get the warm-up. Statistics are
per prompt group, in tokens. Metrics: penalised_frac (rollouts with len_i < 0) and penalty_mean
(mean −w·len_i over them).
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


class KimiConfig(Strict):
    name: Literal["kimi"] = "kimi"
    weight: float = Field(0.5, gt=0, description="weight of the length reward (not given in the paper)")


def kimi_length_reward(correct: Tensor, lengths: Tensor) -> Tensor:
    """len_i of Kimi k1.5, [P, G]."""
    length = lengths.float()
    lo = length.amin(dim=1, keepdim=True)
    hi = length.amax(dim=1, keepdim=True)
    span = (hi - lo).clamp(min=1e-9)
    lam = torch.where(hi > lo, 0.5 - (length - lo) / span, torch.zeros_like(length))
    return torch.where(correct, lam, lam.clamp(max=0.0))


class Kimi(Strategy):
    name = "kimi"

    def __init__(self, config: KimiConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        base = correctness(batch)
        rewards = base + self.config.weight * kimi_length_reward(batch.correct, batch.lengths)
        return Shaped(rewards, penalty_metrics(base, rewards))

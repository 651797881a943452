"""Group-normalised advantages (GRPO, arXiv 2402.03300; Dr. GRPO, arXiv 2503.20783).

For the G rollouts of one prompt with rewards r_1..r_G:

    group   A_i = (r_i − mean(r)) / (std(r) + ε)        GRPO
    batch   A_i = (r_i − mean(r)) / (std(all rewards in the batch) + ε)
    none    A_i =  r_i − mean(r)                         Dr. GRPO (no std division)

std is the population standard deviation (ddof = 0), ε = 1e-6. A group whose rewards are all
equal gets zero advantages under every mode.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

AdvantageNorm = Literal["group", "batch", "none"]
EPS = 1e-6


def group_advantages(rewards: Tensor, norm: AdvantageNorm = "group") -> Tensor:
    """Advantages [P, G] from shaped rewards [P, G]."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if norm == "none":
        return centred
    if norm == "group":
        return centred / (rewards.std(dim=1, unbiased=False, keepdim=True) + EPS)
    if norm == "batch":
        return centred / (rewards.std(unbiased=False) + EPS)
    raise ValueError(f"unknown advantage normalisation {norm!r}; valid: group, batch, none")

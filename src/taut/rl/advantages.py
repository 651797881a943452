"""Group-normalised advantages (GRPO, arXiv 2402.03300; Dr. GRPO, arXiv 2503.20783).

For the G rollouts of one prompt with rewards r_1..r_G:

    group          A_i = (r_i − mean(r)) / (std(r) + ε)                     GRPO
    batch          A_i = (r_i − mean(r)) / (std(all rewards in the batch) + ε)
    batch-centred  A_i = c_i / (std(all c in the batch) + ε),  c = r − mean(r)
                   REINFORCE++-baseline (arXiv 2501.03262), as DLER (arXiv 2510.15110) uses it
    none           A_i =  r_i − mean(r)                                      Dr. GRPO (no std division)

std is the population standard deviation (ddof = 0), ε = 1e-6. `batch` divides by the spread of
the raw rewards, which includes the differences between prompts; `batch-centred` by the spread
left after each group's mean is removed, so it is never larger (the batch mean of c is 0:
every group's c sums to 0).

A group whose rewards are all equal gets exactly zero advantages under every mode. "Equal" is
decided on the spread max(r) − min(r), up to a tolerance relative to the rewards' scale
(1e-6 · max(1, max |r|)): rewards such as 0.7 are not representable in float32, so the mean of
eight of them is one ulp off, and dividing that rounding error by (std + ε) would give every
rollout of the group an advantage of about ±0.06 — a noise gradient from a group with nothing
to teach.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AdvantageNorm = Literal["group", "batch", "batch-centred", "none"]
EPS = 1e-6
EQUAL_TOLERANCE = 1e-6


def group_advantages(rewards: Tensor, norm: AdvantageNorm = "group") -> Tensor:
    """Advantages [P, G] from shaped rewards [P, G]."""
    if norm not in ("group", "batch", "batch-centred", "none"):
        raise ValueError(f"unknown advantage normalisation {norm!r}; valid: group, batch, batch-centred, none")
    informative = informative_groups(rewards).unsqueeze(1)                               # [P, 1]
    centred = torch.where(informative, rewards - rewards.mean(dim=1, keepdim=True), torch.zeros_like(rewards))
    if norm == "none":
        return centred
    if norm == "group":
        return centred / (rewards.std(dim=1, unbiased=False, keepdim=True) + EPS)
    if norm == "batch":
        return centred / (rewards.std(unbiased=False) + EPS)
    return centred / (centred.std(unbiased=False) + EPS)


def informative_groups(rewards: Tensor) -> Tensor:
    """[P] bool: groups whose rewards are not all equal (the same test the advantages use)."""
    spread = rewards.amax(dim=1) - rewards.amin(dim=1)                                    # [P]
    return spread > EQUAL_TOLERANCE * rewards.abs().amax().clamp(min=1.0)

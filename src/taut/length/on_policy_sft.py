"""`on-policy-sft`: supervised fine-tuning on the model's own correct, untruncated samples.

Source: arXiv 2602.13407 (official code read: keep all correct rollouts, truncation acts as the
length filter, token-mean cross-entropy on the kept responses; no KL, no group normalisation).

    keep_i = 1[correct_i] · 1[not truncated_i]                 (keep: all)
    keep_i = the shortest kept rollout of the group only        (keep: shortest — the
             "shortest rejection sampling" of Kimi k1.5, arXiv 2501.12599)
    loss   = − Σ_i keep_i Σ_t log π(y_i,t | …) / Σ_i keep_i |y_i|

The trainer reads `objective = "sft"` and trains with this loss instead of the policy gradient
(`taut.rl.objectives.OnPolicySFT`); the shaped "rewards" are the keep mask (ties for the
shortest: the first in batch order). For this objective a group teaches something when it keeps
at least one rollout, so dynamic sampling drops only groups with nothing kept and keeps an
all-kept group (all ones); with dynamic sampling off, as in the shipped recipe, a group with
nothing kept adds no loss rows. Departures: the paper samples 32 rollouts per prompt at a 3,500-token cap and
trains two epochs over the kept data; here the kept rollouts of each step are trained on once.
Metric: kept_frac, the share of rollouts kept.
"""

from __future__ import annotations

from typing import Literal

from taut.lazy import lazy_module
from taut.length.base import GroupBatch, Shaped, Strategy, correctness
from taut.schema import Strict

torch = lazy_module("torch")     # loaded on first use: a recipe validates without it (taut.lazy)


class OnPolicySftConfig(Strict):
    name: Literal["on-policy-sft"] = "on-policy-sft"
    keep: Literal["all", "shortest"] = "all"


class OnPolicySft(Strategy):
    name = "on-policy-sft"
    objective = "sft"

    def __init__(self, config: OnPolicySftConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        keep = correctness(batch) * (~batch.truncated).float()
        if self.config.keep == "shortest":
            length = torch.where(keep > 0, batch.lengths.float(), torch.full_like(keep, float("inf")))
            first_min = torch.zeros_like(keep)
            idx = length.argmin(dim=1)
            rows = torch.arange(keep.shape[0])
            first_min[rows, idx] = 1.0
            keep = keep * first_min
        return Shaped(keep, {"kept_frac": keep.mean().item()})

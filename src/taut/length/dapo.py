"""`dapo-overlong` (and presets `dapo-lite`, `dapo-heavy`): DAPO's soft overlong punishment.

Source: DAPO, arXiv 2503.14476, Eq. 13. With L_max the length limit and L_cache the buffer,
added to the correctness reward of every rollout, correct or not:

    R_len(ℓ) = 0                                      ℓ ≤ L_max − L_cache
             = ((L_max − L_cache) − ℓ) / L_cache · f   L_max − L_cache < ℓ ≤ L_max
             = −f                                     ℓ > L_max
    r_i = 1[correct_i] + R_len(ℓ_i) / 2

DAPO adds R_len to a ±1 reward; taut's correctness reward is {0, 1}, the same reward under
r' = (r + 1) / 2, so the penalty is halved to keep the paper's proportions: a correct rollout
past the limit scores 1/2, halfway between correct and wrong as in the paper (1 − 1 = 0 between
+1 and −1). Adding the unscaled penalty would make a correct rollout at the cap score the same
as a wrong one, and double the penalty's weight relative to correctness. Under group
normalisation the advantages are then exactly those of the paper's formulation (an affine map
of a group's rewards leaves its normalised advantages unchanged).

f is the penalty factor (1 in the paper). L_max defaults to the rollout cap of the step, so the
penalty follows a cap that changes; the buffer is given as a fraction of L_max, 0.2 by default
as in the paper (L_cache = 4,096 of L_max = 20,480).

The presets are the "global soft penalty" baselines of arXiv 2601.06052, whose settings are not
public. Our reading: `dapo-lite` a quarter of the cap as buffer at half strength,
`dapo-heavy` three quarters of the cap at full strength — so the heavy one starts penalising
well inside the lengths that hard problems need. Metrics: penalised_frac (rollouts in or past
the buffer) and penalty_mean (mean |R_len| over them).
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


class DapoOverlongConfig(Strict):
    name: Literal["dapo-overlong"] = "dapo-overlong"
    buffer_fraction: float = Field(0.2, gt=0, le=1, description="L_cache as a fraction of L_max (paper: 4096 / 20480)")
    penalty_factor: float = Field(1.0, gt=0)
    max_length: int | None = Field(None, gt=0, description="L_max in tokens; default: the rollout cap")


class DapoLiteConfig(DapoOverlongConfig):
    name: Literal["dapo-lite"] = "dapo-lite"
    buffer_fraction: float = Field(0.25, gt=0, le=1)
    penalty_factor: float = Field(0.5, gt=0)


class DapoHeavyConfig(DapoOverlongConfig):
    name: Literal["dapo-heavy"] = "dapo-heavy"
    buffer_fraction: float = Field(0.75, gt=0, le=1)
    penalty_factor: float = Field(1.0, gt=0)


REWARD_SCALE = 0.5      # the {0, 1} reward's range over DAPO's ±1 range


def overlong_penalty(lengths: Tensor, max_length: int, buffer: float, factor: float) -> Tensor:
    """R_len of DAPO Eq. 13, elementwise, scaled by `factor`."""
    length = lengths.float()
    start = max_length - buffer
    inside = ((start - length) / buffer).clamp(min=-1.0, max=0.0)
    return factor * torch.where(length > max_length, torch.full_like(length, -1.0), inside)


class DapoOverlong(Strategy):
    name = "dapo-overlong"

    def __init__(self, config: DapoOverlongConfig):
        self.config = config
        self.name = config.name

    def shape(self, batch: GroupBatch) -> Shaped:
        cfg = self.config
        max_length = cfg.max_length or batch.cap
        base = correctness(batch)
        penalty = overlong_penalty(batch.lengths, max_length, cfg.buffer_fraction * max_length, cfg.penalty_factor)
        rewards = base + REWARD_SCALE * penalty
        return Shaped(rewards, penalty_metrics(base, rewards))

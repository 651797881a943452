"""`hard-truncation` and `thinkprune`: a hard rollout cap, capped rollouts score 0.

hard-truncation — the sample-level hard-truncation baseline of arXiv 2601.06052 (whose settings
are not public): one fixed low cap for the whole phase.

    r_i = 1[correct_i] · 1[not truncated_i]

thinkprune (arXiv 2504.01296) — the same reward under a cap lowered in stages (the paper:
4k → 3k → 2k tokens, each round a separate RL run from the chosen checkpoint of the previous
round):

    L(t) = caps[min(⌊t / steps_per_stage⌋, len(caps) − 1)]

Departures: here the stages follow each other within one phase, `steps_per_stage` steps each,
with no checkpoint choice in between (the paper's per-round choice — the shortest checkpoint
losing at most 10 % relative accuracy — is not reproduced; `selection.criterion:
shortest-within` chooses a run's checkpoint by a rule of that kind). The paper also writes the
limit into the system prompt, which we do not (the testbed model was not trained to read it).
Both caps replace `rl.max_new_tokens`.
Metrics: penalised_frac and penalty_mean, as for siri; the trainer logs the cap.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from taut.length.base import GroupBatch, Shaped, Strategy
from taut.length.siri import capped_rewards
from taut.schema import Strict


class HardTruncationConfig(Strict):
    name: Literal["hard-truncation"] = "hard-truncation"
    cap: int = Field(48, gt=0, description="the fixed rollout cap (tokens)")


class ThinkPruneConfig(Strict):
    name: Literal["thinkprune"] = "thinkprune"
    caps: list[int] = Field(default_factory=lambda: [96, 72, 48], min_length=1, description="cap of each stage (tokens)")
    steps_per_stage: int = Field(30, gt=0)

    @field_validator("caps")
    @classmethod
    def _lowered(cls, v: list[int]) -> list[int]:
        if any(c <= 0 for c in v) or any(b > a for a, b in zip(v, v[1:])):
            raise ValueError(f"caps must be positive and never rise from one stage to the next, got {v}")
        return v


class HardTruncation(Strategy):
    name = "hard-truncation"

    def __init__(self, config: HardTruncationConfig):
        self.config = config

    def cap(self, step: int, default: int) -> int:
        return self.config.cap

    def shape(self, batch: GroupBatch) -> Shaped:
        return capped_rewards(batch)


class ThinkPrune(Strategy):
    name = "thinkprune"

    def __init__(self, config: ThinkPruneConfig):
        self.config = config

    def cap(self, step: int, default: int) -> int:
        stage = min(step // self.config.steps_per_stage, len(self.config.caps) - 1)
        return self.config.caps[stage]

    def shape(self, batch: GroupBatch) -> Shaped:
        return capped_rewards(batch)

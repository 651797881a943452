"""`hard-truncation` and `thinkprune`: a hard rollout cap, capped rollouts score 0.

hard-truncation — the sample-level hard-truncation baseline of arXiv 2601.06052 (whose settings
are not public): one fixed low cap for the whole phase.

    r_i = 1[correct_i] · 1[not truncated_i]

thinkprune (arXiv 2504.01296) — the same reward under a cap lowered in stages, each stage
starting from the previous one (the paper: 4k → 3k → 2k tokens, each round a separate RL run
from the chosen checkpoint of the previous round). Here the stages follow each other within
one phase, `steps_per_stage` steps each; the paper also writes the limit into the system
prompt, which we do not (the testbed model was not trained to read it). Its checkpoint
selection per round (shortest among those losing ≤ 10 % relative accuracy) is available
through the curriculum's selection rules.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from taut.length.base import GroupBatch, Shaped, Strategy, correctness
from taut.schema import Strict


class HardTruncationConfig(Strict):
    name: Literal["hard-truncation"] = "hard-truncation"
    cap: int = Field(48, gt=0, description="the fixed rollout cap (tokens)")


class ThinkPruneConfig(Strict):
    name: Literal["thinkprune"] = "thinkprune"
    caps: list[int] = Field(default_factory=lambda: [96, 72, 48], min_length=1, description="cap of each stage (tokens)")
    steps_per_stage: int = Field(30, gt=0)


def _capped_reward(batch: GroupBatch) -> Shaped:
    rewards = correctness(batch) * (~batch.truncated).float()
    return Shaped(rewards, {"cap": float(batch.cap), "truncated_correct_zeroed": float((batch.correct & batch.truncated).float().mean())})


class HardTruncation(Strategy):
    name = "hard-truncation"

    def __init__(self, config: HardTruncationConfig):
        self.config = config

    def cap(self, step: int, default: int) -> int:
        return self.config.cap

    def shape(self, batch: GroupBatch) -> Shaped:
        return _capped_reward(batch)


class ThinkPrune(Strategy):
    name = "thinkprune"

    def __init__(self, config: ThinkPruneConfig):
        self.config = config

    def cap(self, step: int, default: int) -> int:
        stage = min(step // self.config.steps_per_stage, len(self.config.caps) - 1)
        return self.config.caps[stage]

    def shape(self, batch: GroupBatch) -> Shaped:
        return _capped_reward(batch)

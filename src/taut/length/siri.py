"""`siri`: an oscillating rollout-length cap with the length-capping reward (arXiv 2509.25176).

    L(t)  from a schedule (cosine, stair, stair-cosine; see `taut.length.schedules`)
    r_i = 1[correct_i] · 1[not truncated_i]     (a rollout that hits the cap scores 0)

The paper's reward extracts the answer from clip(y, L(t)); a response that reached the cap has
no final answer in its setting. The testbed writes its answer before post-answer rounds, so a
capped rollout may already hold a gradable answer: we score every rollout that hit the cap as
0, as the paper's "rollouts hitting the cap score 0" intends. L(t) replaces `rl.max_new_tokens`
as the rollout cap; t is the step the trainer passes (counted from the start of the phase that
runs the schedule). There is no explicit length penalty: the only pressure comes from
truncation. Metrics: penalised_frac (correct rollouts zeroed because they hit the cap) and
penalty_mean (1 whenever any were); the trainer logs the cap L(t) itself.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from taut.length.base import GroupBatch, Shaped, Strategy, correctness, penalty_metrics
from taut.length.schedules import ScheduleKind, length_cap
from taut.schema import Strict


class SiriConfig(Strict):
    name: Literal["siri"] = "siri"
    schedule: ScheduleKind = "cosine"
    l_max: int = Field(128, gt=0, description="cap at the start of each cycle (tokens)")
    l_min: int = Field(64, gt=0, description="cap at the middle of each cycle (tokens)")
    period: int = Field(40, gt=0, description="cycle length T in steps")

    @model_validator(mode="after")
    def _order(self):
        if self.l_min > self.l_max:
            raise ValueError(f"l_min ({self.l_min}) must not exceed l_max ({self.l_max})")
        return self


def capped_rewards(batch: GroupBatch) -> Shaped:
    """The length-capping reward shared by siri, hard-truncation and thinkprune."""
    base = correctness(batch)
    rewards = base * (~batch.truncated).float()
    return Shaped(rewards, penalty_metrics(base, rewards))


class Siri(Strategy):
    name = "siri"

    def __init__(self, config: SiriConfig):
        self.config = config

    def cap(self, step: int, default: int) -> int:
        c = self.config
        return length_cap(c.schedule, step, c.l_max, c.l_min, c.period)

    def shape(self, batch: GroupBatch) -> Shaped:
        return capped_rewards(batch)

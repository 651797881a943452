"""`none`: the correctness reward alone — plain GRPO/DAPO (DeepSeekMath arXiv 2402.03300; DAPO 2503.14476).

    r_i = 1[correct_i]

DAPO's correctness reward is ±1; with group-normalised advantages the two give the same
advantages, and {0, 1} keeps every strategy on one scale. A rollout truncated at the trainer's
cap is graded like any other: it scores only if its answer was already complete.
"""

from __future__ import annotations

from typing import Literal

from taut.length.base import GroupBatch, Shaped, Strategy, correctness
from taut.schema import Strict


class NoneConfig(Strict):
    name: Literal["none"] = "none"


class NoStrategy(Strategy):
    name = "none"

    def __init__(self, config: NoneConfig):
        self.config = config

    def shape(self, batch: GroupBatch) -> Shaped:
        return Shaped(correctness(batch))

"""What every rollout engine shares: the request (`SamplingParams`), the result (`Rollouts`) and the
interface (`RolloutEngine`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Rollouts:
    """Responses of one generate call; row r answers prompt `prompt_index[r]`."""

    prompt_index: list[int]       # [R]
    tokens: list[list[int]]       # [R][len] response tokens; the real <eos> included when it ended
    truncated: list[bool]         # [R] reached the cap without <eos>
    logprobs: list[list[float]] | None = None   # [R][len] log-prob of each token under the distribution it was
                                                # sampled from (NaN for forced prefix tokens); when asked for

    @property
    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0      # 0 = greedy
    top_p: float = 1.0
    min_new_tokens: int = 0       # <eos> is not sampled before this many tokens (benchmarks at forced length)
    logprobs: bool = False        # also return each sampled token's log-prob (Rollouts.logprobs)


class RolloutEngine(Protocol):
    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        response_prefix: list[int] | None = None,
        ban_first: list[int] | None = None,
    ) -> Rollouts:
        """`n` responses to each prompt, rows grouped by prompt (prompt 0's n rows first).

        `response_prefix` is forced at the start of every response and counts as response
        tokens; `ban_first` lists tokens the first sampled token may not be.
        """
        ...

    def sync_weights(self) -> None:
        """Make the engine sample from the policy's current weights (no-op when shared)."""
        ...

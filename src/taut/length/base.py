"""What a length strategy sees and returns.

A strategy sees one batch of rollouts *grouped by prompt*: for each of P prompts, G rollouts,
with their correctness (from the task's verifier), length in tokens and truncation flag. It
returns shaped rewards of the same shape and a few metrics. Strategies that control the
rollout length cap (SIRI, hard truncation, ThinkPrune) also say what the cap is at a step;
strategies that write a token budget into the prompt (L1) say which budget.

Nothing here grades a response: correctness arrives as a tensor computed by `Task.verify`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class GroupBatch:
    correct: Tensor          # [P, G] bool — the task verifier's verdicts
    lengths: Tensor          # [P, G] int  — response tokens, <eos> included when present
    truncated: Tensor        # [P, G] bool — hit the length cap without <eos>
    step: int                # RL step (counted from the start of training)
    cap: int                 # the length cap these rollouts were generated under
    prompt_ids: tuple[str, ...] = ()   # [P] problem ids, for per-prompt memory
    budgets: Tensor | None = None      # [P] token budgets written into prompts (L1), if any

    def __post_init__(self):
        shape = self.correct.shape
        if self.correct.dim() != 2 or self.lengths.shape != shape or self.truncated.shape != shape:
            raise ValueError(
                f"correct, lengths and truncated must share one [prompts, group] shape; got "
                f"{tuple(self.correct.shape)}, {tuple(self.lengths.shape)}, {tuple(self.truncated.shape)}"
            )
        if self.prompt_ids and len(self.prompt_ids) != shape[0]:
            raise ValueError(f"{len(self.prompt_ids)} prompt ids for {shape[0]} groups")

    @classmethod
    def from_flat(cls, group_ids: list[str], correct, lengths, truncated, *, step: int, cap: int, budgets=None) -> "GroupBatch":
        """Regroup flat per-rollout lists whose rollouts of one prompt are contiguous.

        Every group must be whole: a prompt whose rollouts are split across a batch boundary
        (fewer rollouts than the others, or not contiguous) is an error, because its group
        statistics would be computed from part of the group.
        """
        if not group_ids:
            raise ValueError("empty batch")
        runs: list[tuple[str, int]] = []
        for gid in group_ids:
            if runs and runs[-1][0] == gid:
                runs[-1] = (gid, runs[-1][1] + 1)
            else:
                runs.append((gid, 1))
        seen = [gid for gid, _ in runs]
        if len(set(seen)) != len(seen):
            dup = next(g for g in seen if seen.count(g) > 1)
            raise ValueError(f"rollouts of prompt {dup!r} are not contiguous; group rollouts by prompt")
        sizes = {n for _, n in runs}
        if len(sizes) != 1:
            size = max(sizes)
            short = [(gid, n) for gid, n in runs if n != size]
            raise ValueError(
                f"group {short[0][0]!r} has {short[0][1]} of {size} rollouts in this batch: a group split "
                f"across a batch boundary cannot be scored; make the batch a multiple of the group size"
            )
        g = sizes.pop()
        as_grid = lambda x, dtype: torch.as_tensor(np.asarray(x), dtype=dtype).view(len(runs), g)  # noqa: E731
        return cls(
            correct=as_grid(correct, torch.bool),
            lengths=as_grid(lengths, torch.long),
            truncated=as_grid(truncated, torch.bool),
            step=step,
            cap=cap,
            prompt_ids=tuple(seen),
            budgets=None if budgets is None else torch.as_tensor(np.asarray(budgets)).view(len(runs), g)[:, 0],
        )


@dataclass
class Shaped:
    rewards: Tensor                              # [P, G] float
    metrics: dict[str, float] = field(default_factory=dict)


def correctness(batch: GroupBatch) -> Tensor:
    """The base reward: 1 for a correct answer, 0 otherwise."""
    return batch.correct.float()


class Strategy:
    """Base class: correctness reward, the trainer's cap, no prompt budget, no state."""

    name: ClassVar[str]
    objective: ClassVar[Literal["policy-gradient", "sft"]] = "policy-gradient"

    def cap(self, step: int, default: int) -> int:
        """Rollout length cap at `step`; `default` is the trainer's `rl.max_new_tokens`."""
        return default

    def budget(self, rng: np.random.Generator) -> int | None:
        """Token budget to write into a prompt (L1-style), or None."""
        return None

    def shape(self, batch: GroupBatch) -> Shaped:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"strategy {self.name!r} keeps no state, got {sorted(state)}")

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
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from taut.lazy import lazy_module

torch = lazy_module("torch")     # loaded on first use: a recipe validates without it (taut.lazy)

if TYPE_CHECKING:
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
    scores: Tensor | None = None       # [P, G] float — partial credit in [0, 1] where the grader gives it

    def __post_init__(self):
        shape = self.correct.shape
        if self.correct.dim() != 2 or self.lengths.shape != shape or self.truncated.shape != shape:
            raise ValueError(
                f"correct, lengths and truncated must share one [prompts, group] shape; got "
                f"{tuple(self.correct.shape)}, {tuple(self.lengths.shape)}, {tuple(self.truncated.shape)}"
            )
        if self.prompt_ids and len(self.prompt_ids) != shape[0]:
            raise ValueError(f"{len(self.prompt_ids)} prompt ids for {shape[0]} groups")
        if self.scores is not None and self.scores.shape != shape:
            raise ValueError(f"scores must have the [prompts, group] shape {tuple(shape)}; got {tuple(self.scores.shape)}")
        if self.budgets is not None and tuple(self.budgets.shape) != (shape[0],):
            raise ValueError(f"budgets must hold one value per group, shape ({shape[0]},); got {tuple(self.budgets.shape)}")

    @classmethod
    def from_flat(cls, group_ids: list[str], correct, lengths, truncated, *, step: int, cap: int,
                  budgets=None, group_size: int | None = None, scores=None) -> "GroupBatch":
        """Regroup flat per-rollout lists whose rollouts of one prompt are contiguous.

        Every group must be whole: a prompt whose rollouts are split across a batch boundary
        (fewer rollouts than the others, or not contiguous) is an error, because its group
        statistics would be computed from part of the group. With `group_size` the groups are
        the consecutive blocks of that size, so the same prompt may be drawn twice in a batch
        (two independent groups); without it, runs of one id are the groups and every prompt
        may appear once.
        """
        if not group_ids:
            raise ValueError("empty batch")
        runs = _groups(list(group_ids), group_size)
        g = runs[0][1]
        n = len(group_ids)
        for name, values in (("correct", correct), ("lengths", lengths), ("truncated", truncated)):
            if len(values) != n:
                raise ValueError(f"{len(values)} {name} values for {n} rollouts")
        as_grid = lambda x, dtype: torch.as_tensor(np.asarray(x), dtype=dtype).view(len(runs), g)  # noqa: E731
        budget_grid = None
        if budgets is not None:
            budget_grid = as_grid(budgets, torch.long)
            if (budget_grid != budget_grid[:, :1]).any():
                raise ValueError("every rollout of a group must carry its prompt's one budget")
        return cls(
            correct=as_grid(correct, torch.bool),
            lengths=as_grid(lengths, torch.long),
            truncated=as_grid(truncated, torch.bool),
            step=step,
            cap=cap,
            prompt_ids=tuple(gid for gid, _ in runs),
            budgets=None if budget_grid is None else budget_grid[:, 0],
            scores=None if scores is None else as_grid(scores, torch.float32),
        )


def _groups(group_ids: list[str], group_size: int | None) -> list[tuple[str, int]]:
    """(prompt id, rollouts) per group, in batch order; raises on a split or interleaved group."""
    if group_size is not None:
        if group_size < 1 or len(group_ids) % group_size:
            raise ValueError(
                f"{len(group_ids)} rollouts do not make whole groups of {group_size}: a group split across a "
                f"batch boundary cannot be scored; make the batch a multiple of the group size")
        blocks = [group_ids[i : i + group_size] for i in range(0, len(group_ids), group_size)]
        for block in blocks:
            if len(set(block)) != 1:
                raise ValueError(f"a block of {group_size} rollouts mixes prompts {sorted(set(block))}: "
                                 f"group rollouts by prompt, contiguously")
        return [(block[0], group_size) for block in blocks]
    runs: list[tuple[str, int]] = []
    for gid in group_ids:
        if runs and runs[-1][0] == gid:
            runs[-1] = (gid, runs[-1][1] + 1)
        else:
            runs.append((gid, 1))
    seen = [gid for gid, _ in runs]
    if len(set(seen)) != len(seen):
        dup = next(g for g in seen if seen.count(g) > 1)
        raise ValueError(f"rollouts of prompt {dup!r} are not contiguous; group rollouts by prompt "
                         f"(or pass group_size when a prompt is drawn twice)")
    size = max(n for _, n in runs)
    short = [(gid, n) for gid, n in runs if n != size]
    if short:
        raise ValueError(
            f"group {short[0][0]!r} has {short[0][1]} of {size} rollouts in this batch: a group split "
            f"across a batch boundary cannot be scored; make the batch a multiple of the group size"
        )
    return runs


@dataclass
class Shaped:
    rewards: Tensor                              # [P, G] float
    metrics: dict[str, float] = field(default_factory=dict)


def correctness(batch: GroupBatch) -> Tensor:
    """The base reward: 1 for a correct answer, 0 otherwise — or the grader's partial credit in
    [0, 1] where it gives one (reasoning-gym tasks); "correct" (accuracy, mastery) stays score 1."""
    return batch.correct.float() if batch.scores is None else batch.scores


def penalty_metrics(base: Tensor, shaped: Tensor) -> dict[str, float]:
    """The two metrics every penalising strategy logs, from rewards before and after shaping.

    penalised_frac  share of the batch's rollouts whose reward the strategy lowered
    penalty_mean    mean reward removed, over those rollouts (0 when none)
    """
    removed = base - shaped                                                       # [P, G]
    penalised = removed > 1e-12
    return {
        "penalised_frac": penalised.float().mean().item(),
        "penalty_mean": removed[penalised].mean().item() if penalised.any() else 0.0,
    }


class Strategy:
    """Base class: correctness reward, the trainer's cap, no prompt budget, no state."""

    name: ClassVar[str]
    objective: ClassVar[Literal["policy-gradient", "sft"]] = "policy-gradient"
    # the advantage normalisation the method is defined with (None: no requirement, GRPO's
    # group std by default); `rl.adv_norm` overrides it with a warning
    adv_norm: ClassVar[Literal["group", "batch", "batch-centred", "none"] | None] = None

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

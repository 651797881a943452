"""What every engine integration shares: strategy configs from plain mappings, and regrouping
an engine's flat batch of rollouts into taut's `GroupBatch` and back.

Engines hand over flat per-rollout lists; taut's strategies see groups. The integrations
decide *which rows form a group* (TRL: consecutive blocks of G; verl: equal `uid`), and these
helpers do the rest, so the shaped rewards are computed by the strategy's own `shape`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from pydantic import BaseModel
from torch import Tensor

from taut.length import GroupBatch, Strategy, build_strategy, get_entry


def strategy_config(value: Any):
    """A validated strategy config from a config object or a mapping with a `name` key."""
    if isinstance(value, Mapping):
        if "name" not in value:
            raise ValueError(f"a strategy mapping needs a 'name' key; got keys {sorted(value)}")
        return get_entry(str(value["name"])).config.model_validate(dict(value))
    if isinstance(value, BaseModel) and "name" in type(value).model_fields:
        entry = get_entry(value.name)
        if not isinstance(value, entry.config):
            raise TypeError(f"a {type(value).__name__} named {value.name!r}; expected a {entry.config.__name__}")
        return value
    raise TypeError(f"expected a strategy config or a mapping with 'name', got {type(value).__name__}")


def reward_strategy(value: Any) -> Strategy:
    """A strategy that shapes rewards for a policy-gradient engine (not `on-policy-sft`)."""
    strategy = build_strategy(strategy_config(value))
    if strategy.objective != "policy-gradient":
        raise ValueError(
            f"strategy {strategy.name!r} trains with objective {strategy.objective!r}, which GRPO engines do "
            f"not run; use taut's own trainer for it"
        )
    return strategy


def group_batch(
    groups: Sequence[Sequence[int]],     # [P][G] row indices of each group
    keys: Sequence[Any],                 # [N] group key of each row
    correct: Sequence[bool],             # [N]
    lengths: Sequence[int],              # [N] tokens, <eos> included when present
    truncated: Sequence[bool],           # [N]
    *,
    step: int,
    cap: int,
    budgets: Sequence[int] | None = None,   # [N], equal within a group
) -> GroupBatch:
    """The `GroupBatch` of flat rows arranged by `groups`; every group must have the same size."""
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups of unequal sizes {sorted(sizes)}: every prompt needs the same number of rollouts")
    grid = lambda values, dtype: torch.tensor([[values[i] for i in g] for g in groups], dtype=dtype)  # noqa: E731
    return GroupBatch(
        correct=grid(correct, torch.bool),
        lengths=grid(lengths, torch.long),
        truncated=grid(truncated, torch.bool),
        step=step,
        cap=cap,
        prompt_ids=tuple(str(keys[g[0]]) for g in groups),
        budgets=None if budgets is None else torch.tensor([budgets[g[0]] for g in groups]),
    )


def ungroup(rewards: Tensor, groups: Sequence[Sequence[int]], n_rows: int) -> Tensor:
    """Flat per-row values [N] from grouped values [P, G] (the inverse of `group_batch`)."""
    flat = torch.full((n_rows,), float("nan"), dtype=rewards.dtype)
    for row_values, g in zip(rewards, groups):
        flat[torch.tensor(list(g))] = row_values
    if torch.isnan(flat).any():
        raise ValueError("some rows belong to no group")
    return flat

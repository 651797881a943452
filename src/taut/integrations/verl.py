"""taut's length strategies inside verl (written against verl 0.9.1, its default v1 trainer in
`trainer.v1.trainer_mode=sync`).

verl loads this module through its plugin mechanism: taut declares it under the entry-point
group `verl.plugins`, which `import verl` loads in every process that imports verl (or list it
in `VERL_USE_EXTERNAL_MODULES=taut.integrations.verl`). It registers:

    advantage estimator "taut"   (`algorithm.adv_estimator=taut`)
        verl calls it once per step on the trainer with the whole batch: token_level_rewards
        [B, T], response_mask [B, T] and index [B] (the `uid` of each rollout's prompt). It reads

            correct    the rollout's scalar score (token_level_rewards summed), which must be 1 for a
                       correct answer and 0 or −1 otherwise: keep verl's reward function pure
                       correctness and let the strategy do the length shaping
            length     response_mask.sum(-1): response tokens, the EOS included
            truncated  length ≥ the cap of the step (the `max_response_length` setting, or the
                       schedule's cap when the capped agent loop below generated the batch)
            group      equal uid, in any row order (verl reorders rows to balance tokens)

        builds taut's `GroupBatch`, shapes it with the strategy's own `shape`, and returns verl's
        own GRPO advantages (`compute_grpo_outcome_advantage`, honouring
        `algorithm.norm_adv_by_std_in_grpo`) of the shaped rewards.

    agent loop "taut_capped"     (`actor_rollout_ref.rollout.agent.default_agent_loop=taut_capped`,
                                  or an `agent_name` column in the training data)
        verl 0.9.1 has no setting for a per-step response cap. This single-turn agent loop sets
        `sampling_params["max_tokens"]` to the schedule's cap at the prompt's step, which verl's
        v1 trainer passes to every agent loop as `global_steps`. Responses are still padded to
        `data.max_response_length`, which must be the schedule's maximum.

Settings go under `algorithm.taut` (added with `+`):

    +algorithm.taut.strategy.name=mastery-gated  +algorithm.taut.strategy.tau=1.0   (any strategy field)
    +algorithm.taut.schedule.name=siri  +algorithm.taut.schedule.l_max=4096 …      (optional; default: the strategy)
    +algorithm.taut.max_response_length=4096                                        (= data.max_response_length)

Steps: verl counts training steps from 1, taut's schedules from 0, so verl step s is taut step
s − 1. The estimator reads the current step from verl's `SkipManager.step`, which verl's
trainers set at the start of every step; with the asynchronous trainers a batch can come from
an earlier step than the one being trained, and its cap would be misread — use the sync trainer.

Not available here, and an error if asked for: `use_best_seen` (verl's uid is a fresh id per
step, so there is no stable prompt id), strategies that write budgets into prompts (l1-*), and
`on-policy-sft`. Strategy metrics are not logged: verl's estimators return advantages only.

What is tested: the estimator through verl's own registry on CPU (`make test-verl`). What is
not: a full verl run, the plugin import inside Ray workers, and the agent loop against a
vLLM/SGLang server — those need GPUs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from verl.experimental.agent_loop.agent_loop import register as register_agent_loop
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est
from verl.utils.skip.skip_manager import SkipManager

from taut.integrations.common import group_batch, reward_strategy, strategy_config, ungroup
from taut.length import Strategy, build_strategy
from taut.length.mastery import MasteryGatedConfig

ESTIMATOR = "taut"
AGENT_LOOP = "taut_capped"


@dataclass(frozen=True)
class VerlSettings:
    """The `algorithm.taut` section: which strategy shapes rewards, which one sets the cap."""

    strategy: Any               # a validated strategy config
    schedule: Any               # the strategy whose cap(step, max_response_length) sets the rollout cap
    max_response_length: int

    @classmethod
    def from_algorithm(cls, algorithm: Any) -> "VerlSettings":
        if algorithm is None or "taut" not in algorithm:
            raise ValueError(
                "the taut estimator needs settings under algorithm.taut, e.g. "
                "+algorithm.taut.strategy.name=mastery-gated +algorithm.taut.max_response_length=<data.max_response_length>"
            )
        section = algorithm["taut"]
        raw = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)
        unknown = set(raw) - {"strategy", "schedule", "max_response_length"}
        if unknown:
            raise ValueError(f"unknown keys algorithm.taut.{sorted(unknown)}; valid: strategy, schedule, max_response_length")
        for key in ("strategy", "max_response_length"):
            if key not in raw:
                raise ValueError(f"missing algorithm.taut.{key} (add it with +algorithm.taut.{key}=...)")
        strategy = strategy_config(raw["strategy"])
        return cls(
            strategy=strategy,
            schedule=strategy if raw.get("schedule") is None else strategy_config(raw["schedule"]),
            max_response_length=int(raw["max_response_length"]),
        )

    def cap(self, step: int) -> int:
        """The rollout cap at taut step `step` (= verl step − 1)."""
        return build_strategy(self.schedule).cap(step, self.max_response_length)


# One strategy object per settings, kept across steps (strategies may keep state).
_STRATEGIES: dict[str, Strategy] = {}


def _strategy(settings: VerlSettings) -> Strategy:
    key = json.dumps(settings.strategy.model_dump(), sort_keys=True)
    if key not in _STRATEGIES:
        strategy = reward_strategy(settings.strategy)
        if isinstance(settings.strategy, MasteryGatedConfig) and settings.strategy.use_best_seen:
            raise ValueError("use_best_seen needs stable prompt ids, which verl's per-step uids are not")
        _STRATEGIES[key] = strategy
    return _STRATEGIES[key]


def correctness_from_scores(scores: Tensor) -> Tensor:
    """[B] bool from scalar scores that must be 1 (correct) or 0 / −1 (wrong)."""
    allowed = (scores - 1).abs().lt(1e-6) | scores.abs().lt(1e-6) | (scores + 1).abs().lt(1e-6)
    if not allowed.all():
        bad = scores[~allowed][:3].tolist()
        raise ValueError(
            f"the taut estimator reads correctness from the score, which must be 1, 0 or -1; got {bad}. "
            f"Keep the reward function pure correctness (no format or length terms, no KL in the reward)."
        )
    return (scores - 1).abs().lt(1e-6)


def group_rows(index: np.ndarray) -> list[list[int]]:
    """Row indices of each uid group, groups in order of first appearance."""
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(index):
        groups.setdefault(uid, []).append(row)
    return list(groups.values())


def taut_advantage(
    token_level_rewards: Tensor,     # [B, T]
    response_mask: Tensor,           # [B, T]
    index: np.ndarray,               # [B] uid of each rollout's prompt
    config: Any,                     # verl's algorithm config (a DictConfig) with a `taut` section
    step: int,                       # taut step (verl step − 1)
    epsilon: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Shaped rewards by the taut strategy, then verl's GRPO advantages: (advantages, returns) [B, T]."""
    settings = VerlSettings.from_algorithm(config)
    strategy = _strategy(settings)
    cap = settings.cap(step)
    scores = token_level_rewards.sum(dim=-1)                            # [B]
    correct = correctness_from_scores(scores)                           # [B]
    lengths = response_mask.sum(dim=-1).long()                          # [B]
    if lengths.max().item() > cap:
        raise ValueError(
            f"a response of {lengths.max().item()} tokens exceeds the cap {cap} of step {step + 1}: the rollouts "
            f"were not generated under the schedule; use the {AGENT_LOOP!r} agent loop"
        )
    truncated = lengths >= cap                                          # [B]
    groups = group_rows(index)
    batch = group_batch(groups, list(index), correct.tolist(), lengths.tolist(), truncated.tolist(), step=step, cap=cap)
    shaped = ungroup(strategy.shape(batch).rewards, groups, len(index)).to(token_level_rewards.dtype)   # [B]
    shaped_rewards = torch.zeros_like(token_level_rewards)
    last = (lengths - 1).clamp(min=0)
    shaped_rewards[torch.arange(len(index)), last] = shaped            # the score at the last response token
    return compute_grpo_outcome_advantage(
        token_level_rewards=shaped_rewards,
        response_mask=response_mask,
        index=index,
        epsilon=epsilon,
        norm_adv_by_std_in_grpo=bool(config["norm_adv_by_std_in_grpo"]),
    )


@register_adv_est(ESTIMATOR)
def compute_taut_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    """verl's entry: the taut strategy at the current training step (from verl's `SkipManager`)."""
    if index is None:
        raise ValueError("the taut estimator needs the uid of every rollout (verl passes it as `index`)")
    if SkipManager.step < 1:
        raise RuntimeError("the taut estimator runs inside a verl training step; SkipManager.step is not set")
    return taut_advantage(token_level_rewards, response_mask, index, config, step=SkipManager.step - 1)


@register_agent_loop(AGENT_LOOP)
class CappedSingleTurnAgentLoop(SingleTurnAgentLoop):
    """verl's single-turn agent loop with `max_tokens` = the schedule's cap at the prompt's step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.settings = VerlSettings.from_algorithm(self.config.algorithm)
        if self.settings.max_response_length != self.response_length:
            raise ValueError(
                f"algorithm.taut.max_response_length={self.settings.max_response_length} must equal "
                f"actor_rollout_ref.rollout.response_length={self.response_length}"
            )

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        if "global_steps" not in kwargs:
            raise RuntimeError(f"the {AGENT_LOOP!r} agent loop needs verl's v1 trainer (trainer.use_v1=True), "
                               f"which passes global_steps to agent loops")
        cap = self.settings.cap(int(kwargs["global_steps"]) - 1)
        return await super().run({**sampling_params, "max_tokens": cap}, **kwargs)


__all__ = ["AGENT_LOOP", "ESTIMATOR", "CappedSingleTurnAgentLoop", "VerlSettings", "compute_taut_advantage", "correctness_from_scores", "taut_advantage"]

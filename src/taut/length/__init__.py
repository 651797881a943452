"""Length-control strategies: one registry, one config type per strategy, selected by `name`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Union

from pydantic import Field

from taut.length.alp import Alp, AlpConfig
from taut.length.base import GroupBatch, Shaped, Strategy
from taut.length.dapo import DapoHeavyConfig, DapoLiteConfig, DapoOverlong, DapoOverlongConfig
from taut.length.dler import Dler, DlerConfig
from taut.length.kimi import Kimi, KimiConfig
from taut.length.l1 import L1, L1ExactConfig, L1MaxConfig
from taut.length.laser import Laser, LaserConfig, LaserD, LaserDConfig
from taut.length.mastery import MasteryGated, MasteryGatedConfig, MasteryGatedNoGateConfig
from taut.length.none import NoneConfig, NoStrategy
from taut.length.on_policy_sft import OnPolicySft, OnPolicySftConfig
from taut.length.shorter_better import ShorterBetter, ShorterBetterConfig
from taut.length.sigmoid import GrpoLambda, GrpoLambdaConfig, Sigmoid, SigmoidConfig
from taut.length.siri import Siri, SiriConfig
from taut.length.truncation import HardTruncation, HardTruncationConfig, ThinkPrune, ThinkPruneConfig


@dataclass(frozen=True)
class Entry:
    config: type
    strategy: type[Strategy]
    source: str
    summary: str


REGISTRY: dict[str, Entry] = {
    "none": Entry(NoneConfig, NoStrategy, "DeepSeekMath 2402.03300", "correctness reward only (plain GRPO/DAPO)"),
    "siri": Entry(SiriConfig, Siri, "SIRI 2509.25176", "oscillating rollout cap (cosine/stair/stair-cosine); capped rollouts score 0"),
    "mastery-gated": Entry(MasteryGatedConfig, MasteryGated, "2601.06052 (our reading)", "soft penalty on correct rollouts longer than a safe length, only on mastered prompts"),
    "mastery-gated-nogate": Entry(MasteryGatedNoGateConfig, MasteryGated, "2601.06052 ablation (ours)", "mastery-gated with the gate off: the same penalty on every group"),
    "dapo-overlong": Entry(DapoOverlongConfig, DapoOverlong, "DAPO 2503.14476", "linear penalty in a buffer before the length limit, on every rollout"),
    "dapo-lite": Entry(DapoLiteConfig, DapoOverlong, "DAPO 2503.14476; preset ours", "dapo-overlong preset: buffer 1/4 of the cap, half strength"),
    "dapo-heavy": Entry(DapoHeavyConfig, DapoOverlong, "DAPO 2503.14476; preset ours", "dapo-overlong preset: buffer 3/4 of the cap, full strength"),
    "hard-truncation": Entry(HardTruncationConfig, HardTruncation, "2601.06052 baseline", "fixed low rollout cap; capped rollouts score 0"),
    "thinkprune": Entry(ThinkPruneConfig, ThinkPrune, "ThinkPrune 2504.01296", "hard cap lowered in stages; capped rollouts score 0"),
    "kimi": Entry(KimiConfig, Kimi, "Kimi k1.5 2501.12599", "group min/max length reward added to correctness"),
    "l1-exact": Entry(L1ExactConfig, L1, "L1 2503.04697", "budget written into the prompt; penalty on |budget − length|"),
    "l1-max": Entry(L1MaxConfig, L1, "L1 2503.04697", "budget written into the prompt; correct × clip(α(budget − length) + δ)"),
    "grpo-lambda": Entry(GrpoLambdaConfig, GrpoLambda, "GRPO-λ 2505.18086", "sigmoid length penalty only on the top-λ groups by correctness"),
    "sigmoid": Entry(SigmoidConfig, Sigmoid, "Arora & Zanette 2502.04463", "correct × (1 − α·σ(z-scored length among correct))"),
    "on-policy-sft": Entry(OnPolicySftConfig, OnPolicySft, "2602.13407", "cross-entropy on own correct, untruncated samples"),
    "dler": Entry(DlerConfig, Dler, "DLER 2510.15110", "truncation (capped rollouts score 0) with batch-wise advantage normalisation"),
    "alp": Entry(AlpConfig, Alp, "ALP 2506.05256 (N: our reading)", "per-token penalty scaled by the prompt's solve rate, max(p, 1/K)"),
    "shorter-better": Entry(ShorterBetterConfig, ShorterBetter, "ShorterBetter 2504.21370", "α·correct − β·|length − shortest correct length of the group|"),
    "laser": Entry(LaserConfig, Laser, "LASER 2505.15612", "step bonus α on correct rollouts within a target length L_T"),
    "laser-d": Entry(LaserDConfig, LaserD, "LASER-D 2505.15612 (monitor: our reading)",
                     "LASER's bonus with one target per difficulty level (group pass rate), refreshed from recent groups"),
}

StrategyConfig = Annotated[
    Union[tuple(entry.config for entry in REGISTRY.values())],  # type: ignore[valid-type]
    Field(discriminator="name"),
]


def get_entry(name: str) -> Entry:
    if name not in REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; valid strategies: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def build_strategy(config) -> Strategy:
    """The strategy object for a validated strategy config."""
    return get_entry(config.name).strategy(config)


__all__ = ["REGISTRY", "GroupBatch", "Shaped", "Strategy", "StrategyConfig", "build_strategy", "get_entry"]

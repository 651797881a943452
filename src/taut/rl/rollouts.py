"""One step's rollouts: draw prompts, generate G responses each, grade them, shape the rewards.

With dynamic sampling (DAPO), groups that teach nothing — for the objective in use — are
dropped and more prompts are drawn, up to `rl.max_sampling_rounds` rounds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from taut.config import RLConfig
from taut.length import GroupBatch, Strategy
from taut.models import Policy
from taut.rollout import RolloutEngine, SamplingParams
from taut.tasks import Problem, Task
from taut.tasks.base import OracleTask


@dataclass
class RolloutBatch:
    """The groups kept for the update (all with G rollouts), plus stats over everything sampled."""

    prompts: list[list[int]] = field(default_factory=list)      # [K*G] prompt ids per rollout
    responses: list[list[int]] = field(default_factory=list)    # [K*G]
    rollout_logp: list[list[float]] | None = None                # [K*G] the engine's log-probs, when recorded
    rewards: list[torch.Tensor] = field(default_factory=list)   # K tensors [G]
    sampled: dict[str, list] = field(default_factory=lambda: {"correct": [], "score": [], "length": [], "truncated": [],
                                                              "redundancy": [], "thinks": []})
    group_pass: list[tuple[str, float]] = field(default_factory=list)   # (problem id, pass rate) of every sampled group
    verifier_errors: int = 0
    strategy_metrics: dict[str, float] = field(default_factory=dict)
    groups_sampled: int = 0
    rounds: int = 0
    generated_tokens: int = 0
    gen_time: float = 0.0
    reward_time: float = 0.0


def collect(policy: Policy, engine: RolloutEngine, draw: Callable[[int], list[tuple[Task, Problem]]], strategy: Strategy,
            informative: Callable[[torch.Tensor], torch.Tensor], cfg: RLConfig, *, step: int, cap: int,
            generator: torch.Generator, np_rng: np.random.Generator) -> RolloutBatch:
    """Generate, grade and shape; with dynamic sampling, drop groups that teach nothing and resample.

    `informative` maps shaped rewards [P, G] to [P] bool: whether a group gives the objective
    anything to learn (see `Objective.informative`).
    """
    G, P = cfg.group_size, cfg.prompts_per_step
    out = RolloutBatch(rollout_logp=[] if cfg.records_rollout_logprobs else None)
    params = SamplingParams(max_new_tokens=cap, temperature=cfg.temperature, top_p=cfg.top_p,
                            min_new_tokens=min(cfg.min_new_tokens, cap), logprobs=cfg.records_rollout_logprobs)
    while out.rounds < cfg.max_sampling_rounds and len(out.rewards) < P:
        out.rounds += 1
        items = draw(P)
        budgets = [strategy.budget(np_rng) for _ in items]
        problems = [p if b is None else task.with_budget(p, b) for (task, p), b in zip(items, budgets)]
        prompt_ids = [policy.encode_prompt(p.prompt) for p in problems]

        t0 = time.perf_counter()
        rollouts = engine.generate(prompt_ids, G, params, generator)
        out.gen_time += time.perf_counter() - t0
        out.generated_tokens += sum(rollouts.lengths)

        t0 = time.perf_counter()
        correct, scores = [], []
        for row, tokens in enumerate(rollouts.tokens):
            task, problem = items[rollouts.prompt_index[row]][0], problems[rollouts.prompt_index[row]]
            text = policy.decode(tokens)
            complete = not rollouts.truncated[row]
            verdict = task.verify(problem, text, complete)
            correct.append(verdict.correct)
            scores.append(verdict.score)
            out.verifier_errors += verdict.error is not None
            if isinstance(task, OracleTask):
                analysis = task.analyze(problem, text, complete, count=policy.count_tokens)
                if analysis is not None:            # None: the response does not follow the oracle's format
                    out.sampled["redundancy"].append(analysis.redundant_tokens / max(1, analysis.length))
                    out.sampled["thinks"].append(analysis.thinks)
        batch = GroupBatch.from_flat(
            [p.id for p in problems for _ in range(G)], correct, rollouts.lengths, rollouts.truncated,
            step=step, cap=cap, budgets=None if budgets[0] is None else [b for b in budgets for _ in range(G)],
            group_size=G,
            scores=None if all(x is None for x in scores) else [float(c) if x is None else x for x, c in zip(scores, correct)],
        )
        shaped = strategy.shape(batch)
        out.reward_time += time.perf_counter() - t0
        if out.rounds == 1:
            out.strategy_metrics = shaped.metrics
        out.sampled["correct"] += correct
        out.sampled["score"] += [float(c) if x is None else x for x, c in zip(scores, correct)]
        out.sampled["length"] += rollouts.lengths
        out.sampled["truncated"] += rollouts.truncated
        out.groups_sampled += len(items)
        out.group_pass += list(zip(batch.prompt_ids, batch.correct.float().mean(dim=1).tolist()))

        useful = informative(shaped.rewards)                                            # [P]
        for g in range(len(items)):
            if len(out.rewards) == P or (cfg.dynamic_sampling and not useful[g]):
                continue
            out.rewards.append(shaped.rewards[g])
            out.prompts += [prompt_ids[g]] * G
            out.responses += rollouts.tokens[g * G : (g + 1) * G]
            if out.rollout_logp is not None:
                out.rollout_logp += rollouts.logprobs[g * G : (g + 1) * G]
        if not cfg.dynamic_sampling:
            break
    return out

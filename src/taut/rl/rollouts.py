"""One step's groups: generate and grade → shape (the strategy) → drop the groups that teach nothing.

`generate_and_grade` draws G responses per prompt and grades them (the verifier, and the oracle
where the task has one); the phase's strategy shapes the rewards; `RolloutBatch.keep` takes the
groups the objective can learn from. With dynamic sampling (DAPO) `collect` repeats the three for
more prompts, up to `rl.max_sampling_rounds` rounds, until the step has `rl.prompts_per_step`
groups; without it one round's groups are all kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from taut.config import SamplingSettings
from taut.length import GroupBatch, Shaped, Strategy
from taut.models.policy import Policy
from taut.rollout import RolloutEngine, Rollouts, SamplingParams
from taut.tasks import Problem, Task
from taut.tasks.base import OracleTask


@dataclass
class Graded:
    """One round's rollouts, graded: G per prompt, in prompt order."""

    prompt_ids: list[list[int]]              # [P] the prompts' token ids
    rollouts: Rollouts
    groups: GroupBatch                       # correctness, scores and lengths as [P, G], for the strategy
    correct: list[bool]                      # [P*G] the verifier's verdicts
    scores: list[float]                      # [P*G] partial credit where the grader gives it, else correct as 0/1
    redundancy: list[float]                  # the oracle's redundant share of each response it could read
    thinks: list[bool]
    verifier_errors: int
    gen_time: float
    grade_time: float


def generate_and_grade(policy: Policy, engine: RolloutEngine, items: list[tuple[Task, Problem]], budgets: list[int | None],
                       params: SamplingParams, group_size: int, *, step: int, generator: torch.Generator | None) -> Graded:
    """G rollouts per problem (with its length budget, where the strategy sets one), graded."""
    G = group_size
    problems = [p if b is None else task.with_budget(p, b) for (task, p), b in zip(items, budgets)]
    prompt_ids = [policy.encode_prompt(p.prompt) for p in problems]
    t0 = time.perf_counter()
    rollouts = engine.generate(prompt_ids, G, params, generator)
    gen_time = time.perf_counter() - t0

    t0 = time.perf_counter()
    correct, scores, redundancy, thinks, errors = [], [], [], [], 0
    for row, tokens in enumerate(rollouts.tokens):
        task, problem = items[rollouts.prompt_index[row]][0], problems[rollouts.prompt_index[row]]
        text = policy.decode(tokens)
        complete = not rollouts.truncated[row]
        verdict = task.verify(problem, text, complete)
        correct.append(verdict.correct)
        scores.append(verdict.score)
        errors += verdict.error is not None
        if isinstance(task, OracleTask):
            analysis = task.analyze(problem, text, complete, count=policy.count_tokens)
            if analysis is not None:            # None: the response does not follow the oracle's format
                redundancy.append(analysis.redundant_tokens / max(1, analysis.length))
                thinks.append(analysis.thinks)
    full = [float(c) if x is None else x for x, c in zip(scores, correct)]
    groups = GroupBatch.from_flat(
        [p.id for p in problems for _ in range(G)], correct, rollouts.lengths, rollouts.truncated,
        step=step, cap=params.max_new_tokens, budgets=None if budgets[0] is None else [b for b in budgets for _ in range(G)],
        group_size=G,
        scores=None if all(x is None for x in scores) else full,
    )
    return Graded(prompt_ids, rollouts, groups, correct, full, redundancy, thinks, errors, gen_time, time.perf_counter() - t0)


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

    def keep(self, graded: Graded, shaped: Shaped, informative: torch.Tensor | None, wanted: int, shape_time: float = 0.0) -> None:
        """Record a round; keep its groups (only the `informative` ones, [P] bool, when given) up to `wanted`."""
        G = graded.groups.correct.shape[1]
        rollouts, groups = graded.rollouts, graded.groups
        self.rounds += 1
        if self.rounds == 1:
            self.strategy_metrics = shaped.metrics
        self.sampled["correct"] += graded.correct
        self.sampled["score"] += graded.scores
        self.sampled["length"] += rollouts.lengths
        self.sampled["truncated"] += rollouts.truncated
        self.sampled["redundancy"] += graded.redundancy
        self.sampled["thinks"] += graded.thinks
        self.verifier_errors += graded.verifier_errors
        self.groups_sampled += len(graded.prompt_ids)
        self.group_pass += list(zip(groups.prompt_ids, groups.correct.float().mean(dim=1).tolist()))
        self.generated_tokens += sum(rollouts.lengths)
        self.gen_time += graded.gen_time
        self.reward_time += graded.grade_time + shape_time
        for g in range(len(graded.prompt_ids)):
            if len(self.rewards) == wanted or (informative is not None and not informative[g]):
                continue
            self.rewards.append(shaped.rewards[g])
            self.prompts += [graded.prompt_ids[g]] * G
            self.responses += rollouts.tokens[g * G : (g + 1) * G]
            if self.rollout_logp is not None:
                self.rollout_logp += rollouts.logprobs[g * G : (g + 1) * G]

    def reward_matrix(self) -> torch.Tensor:
        return torch.stack(self.rewards)                                            # [K, G]

    def response_lengths(self) -> torch.Tensor:
        return torch.tensor([len(r) for r in self.responses])                      # [K*G]


def collect(policy: Policy, engine: RolloutEngine, draw: Callable[[int], list[tuple[Task, Problem]]], strategy: Strategy,
            informative: Callable[[torch.Tensor], torch.Tensor], sampling: SamplingSettings, *, step: int, cap: int,
            generator: torch.Generator | None, np_rng: np.random.Generator) -> RolloutBatch:
    """generate and grade → shape → drop uninformative groups, in rounds until the step has its
    groups (one round without dynamic sampling). `informative` maps shaped rewards [P, G] to [P]
    bool: whether a group gives the objective anything to learn (`Objective.informative`)."""
    P = sampling.prompts_per_step
    params = SamplingParams(max_new_tokens=cap, temperature=sampling.temperature, top_p=sampling.top_p,
                            min_new_tokens=min(sampling.min_new_tokens, cap), logprobs=sampling.logprobs)
    batch = RolloutBatch(rollout_logp=[] if sampling.logprobs else None)
    while batch.rounds < (sampling.max_sampling_rounds if sampling.dynamic_sampling else 1) and len(batch.rewards) < P:
        items = draw(P)
        graded = generate_and_grade(policy, engine, items, [strategy.budget(np_rng) for _ in items], params,
                                    sampling.group_size, step=step, generator=generator)
        t0 = time.perf_counter()
        shaped = strategy.shape(graded.groups)
        batch.keep(graded, shaped, informative(shaped.rewards) if sampling.dynamic_sampling else None, P,
                   shape_time=time.perf_counter() - t0)
    return batch

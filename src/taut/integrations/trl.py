"""taut's length strategies inside TRL's `GRPOTrainer` (written and tested against trl 1.16).

    StrategyReward     a reward function in TRL's calling convention: grades every completion with
                       the user's verifier, regroups the completions by prompt into taut's
                       `GroupBatch` and returns the strategy's `shape` — the rewards taut's own
                       trainer computes on the same rollouts.
    LengthCapCallback  a `TrainerCallback` that sets each step's rollout cap from a strategy's
                       `cap(step, default)`: SIRI's schedules, ThinkPrune's stages, a fixed hard cap.
    TaskVerifier       a taut task's verifier in the form StrategyReward calls.

What the reward reads from TRL, per completion:

    correct    verifier(completion_text, answer) — or verifier(..., complete=not truncated) when the
               verifier takes a `complete` keyword, as `TaskVerifier` does. Nothing here grades.
    length     len(completion_ids): tokens, the EOS included when present (TRL keeps it).
    truncated  the last id is not an EOS id: generation stopped at the cap.
    group      TRL's RepeatSampler lays out a generation batch as consecutive blocks of G =
               num_generations completions of one prompt. Reward functions run on each process's
               slice, so a block straddles two processes whenever
               per_device_train_batch_size × steps_per_generation is not a multiple of G. With
               `gather=True` (default) the per-completion records (key, correct, length, truncated)
               are all-gathered with accelerate's `gather_object`, every process shapes the whole
               batch, and each keeps its own slice. With `gather=False` a split group is an error.
    step, cap  `trainer_state.global_step`, and the schedule's cap at that step: the step at which
               `LengthCapCallback.on_step_begin` set the cap these completions were generated under.

Where this departs from taut's own trainer: TRL computes the advantages (its `scale_rewards`,
with an unbiased std and its own ε), the loss and the sampling, and it has no dynamic sampling.
Strategy state (mastery-gated `use_best_seen`) lives in the reward object and is not written to
TRL checkpoints. The cap with vLLM generation (`use_vllm=True`) is set on
`trainer.vllm_generation.max_completion_length`, which TRL reads at every generation; that path
needs a GPU and is not exercised by taut's tests.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from accelerate import PartialState
from accelerate.utils import gather_object
from transformers import TrainerCallback

from taut.integrations.common import group_batch, reward_strategy, strategy_config, ungroup
from taut.length import build_strategy
from taut.tasks import Problem, Task, load_task

Verifier = Callable[..., bool]    # (completion_text, answer) -> bool, optionally with keyword `complete`


class VerifierError(RuntimeError):
    """A verifier that could not grade a response (not the same as a wrong answer)."""


class TaskVerifier:
    """A taut task's grader as a TRL verifier: `(completion, answer, complete=True) -> bool`.

    taut's verifiers (testbed, math, exact match) read only the problem's reference answer, so
    a `Problem` is rebuilt from the dataset's answer column. A verifier error raises
    `VerifierError` instead of counting as a wrong answer. Picklable: a task given by its spec
    (`"gym:add"`) is rebuilt from the spec when unpickled.
    """

    def __init__(self, task: Task | str):
        self.spec = task if isinstance(task, str) else None
        self.task = load_task(task) if isinstance(task, str) else task

    def __call__(self, completion: str, answer: Any, complete: bool = True) -> bool:
        problem = Problem(id="trl", prompt="", answer=str(answer), domain=self.task.name)
        verdict = self.task.verify(problem, completion, complete)
        if verdict.error is not None:
            raise VerifierError(f"{self.task.name} could not grade a response: {verdict.error}")
        return verdict.correct

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec} if self.spec is not None else {"spec": None, "task": self.task}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec = state["spec"]
        self.task = load_task(self.spec) if self.spec is not None else state["task"]


class _Record(NamedTuple):
    rank: int
    key: str
    correct: bool
    length: int
    truncated: bool
    budget: int | None


class StrategyReward:
    """A taut length strategy as a TRL reward function (see the module docstring).

    strategy               a strategy config, or a mapping such as {"name": "mastery-gated", "tau": 1.0}
    verifier               (completion_text, answer) -> bool; `TaskVerifier(task)` for a taut task
    num_generations        G, equal to `GRPOConfig.num_generations`
    max_completion_length  equal to `GRPOConfig.max_completion_length`: the default cap
    eos_token_id           the id(s) that end a completion (the tokenizer's EOS, plus the model's)
    schedule               the strategy whose `cap(step, default)` sets the rollout cap (default: `strategy`),
                           e.g. a SIRI config when the reward is mastery-gated; must match the callback's
    gather                 all-gather completions so groups split across processes are scored whole
    answer_column          dataset column with the reference answer passed to the verifier
    id_column              dataset column that identifies a prompt (default: the prompt itself); its
                           values key the per-prompt memory of `use_best_seen`
    budget_column          dataset column with the token budget written into each prompt (L1 strategies)
    """

    def __init__(
        self,
        strategy: Any,
        verifier: Verifier,
        *,
        num_generations: int,
        max_completion_length: int,
        eos_token_id: int | Sequence[int],
        schedule: Any = None,
        gather: bool = True,
        answer_column: str = "answer",
        id_column: str | None = None,
        budget_column: str | None = None,
    ):
        if num_generations < 2:
            raise ValueError(f"num_generations must be at least 2 for group statistics, got {num_generations}")
        self.strategy = reward_strategy(strategy)
        self.schedule_config = strategy_config(self.strategy.config if schedule is None else schedule)
        self._schedule = build_strategy(self.schedule_config)
        self.verifier = verifier
        self._pass_complete = "complete" in inspect.signature(verifier).parameters
        self.num_generations = num_generations
        self.max_completion_length = max_completion_length
        self.eos_token_ids = frozenset([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
        self.gather = gather
        self.answer_column, self.id_column, self.budget_column = answer_column, id_column, budget_column
        self.__name__ = f"taut-{self.strategy.name}"    # TRL logs rewards/<__name__>/mean

    def cap(self, step: int) -> int:
        """The rollout cap at `step`, as `LengthCapCallback` sets it."""
        return self._schedule.cap(step, self.max_completion_length)

    def __call__(self, prompts: list, completions: list, completion_ids: list[list[int]], *,
                 trainer_state=None, log_metric: Callable[[str, float], None] | None = None, **columns) -> list[float]:
        if trainer_state is None:
            raise ValueError(f"{self.__name__} needs `trainer_state` (GRPOTrainer passes it; the async trainer does not)")
        step = trainer_state.global_step
        cap = self.cap(step)
        local = self._records(prompts, completions, completion_ids, columns)
        longest = max(r.length for r in local)
        if longest > cap:
            raise ValueError(
                f"a completion of {longest} tokens exceeds the cap {cap} of step {step}: the rollouts were not "
                f"generated under the schedule; add LengthCapCallback(trainer, schedule) to the trainer"
            )

        records = gather_object(local) if self.gather else local
        groups = self._groups(records)
        batch = group_batch(
            groups, [r.key for r in records], [r.correct for r in records], [r.length for r in records],
            [r.truncated for r in records], step=step, cap=cap,
            budgets=None if self.budget_column is None else [r.budget for r in records],
        )
        shaped = self.strategy.shape(batch)
        rewards = ungroup(shaped.rewards, groups, len(records)).tolist()

        if log_metric is not None:
            log_metric(f"{self.__name__}/cap", float(cap))
            log_metric(f"{self.__name__}/accuracy", batch.correct.float().mean().item())
            log_metric(f"{self.__name__}/truncated", batch.truncated.float().mean().item())
            for name, value in shaped.metrics.items():
                log_metric(f"{self.__name__}/{name}", float(value))
        rank = local[0].rank
        return [reward for reward, r in zip(rewards, records) if r.rank == rank]

    def _records(self, prompts, completions, completion_ids, columns) -> list[_Record]:
        for column in filter(None, (self.answer_column, self.id_column, self.budget_column)):
            if column not in columns:
                dataset_columns = sorted(k for k in columns if k not in ("log_extra", "environments"))
                raise ValueError(f"no dataset column {column!r} reached the reward; columns: {', '.join(dataset_columns)}")
        rank = PartialState().process_index
        records = []
        for i, (prompt, completion, ids) in enumerate(zip(prompts, completions, completion_ids, strict=True)):
            truncated = not ids or ids[-1] not in self.eos_token_ids
            text, answer = _text(completion), columns[self.answer_column][i]
            correct = (self.verifier(text, answer, complete=not truncated) if self._pass_complete
                       else self.verifier(text, answer))
            key = columns[self.id_column][i] if self.id_column else _prompt_key(prompt)
            budget = None if self.budget_column is None else int(columns[self.budget_column][i])
            records.append(_Record(rank, str(key), bool(correct), len(ids), truncated, budget))
        return records

    def _groups(self, records: list[_Record]) -> list[list[int]]:
        """Consecutive blocks of G rows, each from one prompt (TRL's RepeatSampler layout)."""
        G, n = self.num_generations, len(records)
        if n % G:
            raise ValueError(
                f"this process holds {n} completions, not a multiple of num_generations={G}: prompt groups are "
                f"split across processes (per_device_train_batch_size × steps_per_generation must be a multiple "
                f"of num_generations), and group statistics over part of a group are wrong. Use gather=True or "
                f"change the batch size."
            )
        groups = [list(range(start, start + G)) for start in range(0, n, G)]
        for g in groups:
            keys = {records[i].key for i in g}
            if len(keys) != 1:
                raise ValueError(
                    f"rows {g[0]}..{g[-1]} should be the {G} completions of one prompt but come from {len(keys)} "
                    f"prompts; num_generations={G} must equal GRPOConfig.num_generations"
                )
        return groups

    def check_trainer(self, trainer, schedule_config) -> None:
        """Raise if this reward disagrees with the trainer or the callback on G, the cap or EOS."""
        problems = []
        if trainer.num_generations != self.num_generations:
            problems.append(f"num_generations is {self.num_generations}, the trainer's {trainer.num_generations}")
        if trainer.max_completion_length != self.max_completion_length:
            problems.append(f"max_completion_length is {self.max_completion_length}, the trainer's {trainer.max_completion_length}")
        if schedule_config != self.schedule_config:
            problems.append(f"schedule is {self.schedule_config!r}, the callback's {schedule_config!r}")
        missing = set(trainer.eos_token_ids) - self.eos_token_ids
        if missing:
            problems.append(f"eos_token_id lacks {sorted(missing)}, which end the trainer's completions")
        if problems:
            raise ValueError(f"{self.__name__}: " + "; ".join(problems))


class LengthCapCallback(TrainerCallback):
    """Sets the rollout cap before every step from `schedule.cap(step, max_completion_length)`.

    TRL keeps the cap in `trainer.generation_config.max_new_tokens` and
    `trainer.generation_kwargs["max_new_tokens"]` (transformers generation) or
    `trainer.vllm_generation.max_completion_length` (vLLM); both are read at every generation.
    `on_step_begin` runs before the step's generation, so the cap of step t applies to the
    completions generated at step t; with steps_per_generation > 1 a new cap takes effect at the
    next generation. The trainer's `max_completion_length` stays the schedule's ceiling (the
    `dr_grpo` loss normaliser and vLLM's context length are built from it): a cap above it is an error.

    Add it after building the trainer: `trainer.add_callback(LengthCapCallback(trainer, schedule))`.
    At the start of training it checks every `StrategyReward` of the trainer against the trainer.
    `applied` maps each step to the cap set before it.
    """

    def __init__(self, trainer, schedule: Any):
        self.trainer = trainer
        self.schedule_config = strategy_config(schedule)
        self._schedule = build_strategy(self.schedule_config)
        self.max_completion_length: int = trainer.max_completion_length
        self.applied: dict[int, int] = {}

    def cap(self, step: int) -> int:
        return self._schedule.cap(step, self.max_completion_length)

    def on_train_begin(self, args, state, control, **kwargs):
        for reward in self.trainer.reward_funcs:
            if isinstance(reward, StrategyReward):
                reward.check_trainer(self.trainer, self.schedule_config)

    def on_step_begin(self, args, state, control, **kwargs):
        step = state.global_step
        cap = self.cap(step)
        if not 0 < cap <= self.max_completion_length:
            raise ValueError(
                f"the {self.schedule_config.name} cap at step {step} is {cap}, outside 1..max_completion_length="
                f"{self.max_completion_length}; set GRPOConfig.max_completion_length to the schedule's maximum"
            )
        trainer = self.trainer
        if trainer.use_vllm:
            trainer.vllm_generation.max_completion_length = cap
        else:
            trainer.generation_config.max_new_tokens = cap
            trainer.generation_kwargs["max_new_tokens"] = cap
        self.applied[step] = cap


def problems_dataset(problems: Sequence[Problem], *, conversational: bool = False):
    """A `datasets.Dataset` with `prompt`, `answer` and `problem_id` columns from taut problems.

    `conversational`: prompts as one user message, for models whose tokenizer has a chat
    template (TRL applies it); otherwise plain strings (the testbed).
    """
    from datasets import Dataset

    def prompt(p: Problem):
        return [{"role": "user", "content": p.prompt}] if conversational else p.prompt

    return Dataset.from_list([{"prompt": prompt(p), "answer": p.answer, "problem_id": p.id} for p in problems])


def eos_token_ids(model, tokenizer) -> list[int]:
    """The ids that end a completion in GRPOTrainer: the tokenizer's EOS and every EOS id the
    model's generation config declares (e.g. an end-of-turn token)."""
    declared = model.generation_config.eos_token_id
    declared = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    return list(dict.fromkeys([tokenizer.eos_token_id, *declared]))


def _text(completion: Any) -> str:
    """The text of a completion: a string, or (conversational datasets) a list of messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in completion):
        return "".join(m["content"] for m in completion)
    raise TypeError(f"cannot read the text of a completion of type {type(completion).__name__}")


def _prompt_key(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


__all__ = ["LengthCapCallback", "StrategyReward", "TaskVerifier", "VerifierError", "eos_token_ids", "problems_dataset"]

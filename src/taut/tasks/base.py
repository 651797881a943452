"""What every task provides: problems with reference answers, and the one verifier that grades them.

A task owns its grader. Rewards, length strategies and evaluation all call `Task.verify`;
nothing else decides whether a response is correct.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")
SPLIT_FRACTIONS = {"train": 0.7, "validation": 0.1, "test": 0.2}


def split_of(key: str) -> Split:
    """Deterministic split of a problem, from a hash of its key: the splits never overlap."""
    u = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64
    if u < SPLIT_FRACTIONS["train"]:
        return "train"
    return "validation" if u < SPLIT_FRACTIONS["train"] + SPLIT_FRACTIONS["validation"] else "test"


def check_split(split: str) -> None:
    """A split taut knows, else a ValueError naming the valid ones."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")


BUDGET_INSTRUCTION = "Think for {budget} tokens."      # L1 / LCPO's wording (arXiv 2503.04697)


@dataclass(frozen=True)
class Problem:
    id: str                     # stable and unique within its task; mastery history is keyed by it
    prompt: str                 # what the model is asked (testbed: in the testbed grammar)
    answer: str                 # reference answer
    domain: str
    difficulty: int | None = None
    held_out: bool = False      # never trained on by RL recipes (transfer evaluation)
    data: Any = field(default=None, compare=False, repr=False)  # task-private (e.g. testbed operands)


@dataclass(frozen=True)
class Verdict:
    correct: bool
    extracted: str | None       # the answer the grader read, None if there was none
    error: str | None = None    # the verifier itself failed (raised, timed out): not a wrong answer
    score: float | None = None  # partial credit in [0, 1] where a task opts in (reasoning-gym: partial_credit)


@dataclass(frozen=True)
class TraceAnalysis:
    """An oracle's view of one response (OracleTask.analyze)."""

    answer: str | None
    correct: bool
    length: int                 # response tokens, <eos> included when the response ended
    necessary_length: int
    redundant_tokens: int
    redundancy: float           # redundant_tokens / length; equals 1 − necessary/length on well-formed traces
    unneeded_thinking: bool     # thinking beyond the necessary steps (any thinking on level 1)
    post_answer_rounds: bool    # anything written between the graded answer and the end
    thinks: bool                # wrote at least one step before </think>
    coverage: float | None      # share of the necessary steps present; None where none are necessary


@runtime_checkable
class Task(Protocol):
    name: str

    def problems(self, split: Split, n_per_level: int, seed: int = 0) -> list[Problem]:
        """Distinct problems of a split, up to `n_per_level` per (domain, difficulty)."""
        ...

    def verify(self, problem: Problem, response: str, complete: bool) -> Verdict:
        """Grade a response. `complete` is False when the response was cut before it ended
        (truncated, or cut at a token budget): an answer still being written does not count."""
        ...

    def with_budget(self, problem: Problem, budget: int) -> Problem:
        """The same problem with a token budget written into its prompt (L1-style strategies)."""
        ...


@runtime_checkable
class OracleTask(Task, Protocol):
    """A task that knows each problem's minimal necessary response (the testbed, taut.tasks.written)."""

    def analyze(self, problem: Problem, response: str, complete: bool, count: Callable[[str], int] | None = None) -> Any:
        """Correctness, redundancy and necessary-step coverage of one response (a TraceAnalysis),
        or None when the response does not follow the format the oracle reads. `count` gives the
        tokens of a text under the policy's tokenizer (the testbed's words are its tokens)."""
        ...


@runtime_checkable
class TraceTask(Task, Protocol):
    """A task that writes its own SFT traces (written arithmetic): `data.sft` draws from it."""

    def sft_examples(self, rng: Any, n: int, split: Split = "train") -> list[tuple[str, str]]:
        """n (prompt, response) pairs from `split`, drawn with `rng` (a random.Random)."""
        ...


CHARS_PER_TOKEN_BOUND = 32      # without a tokenizer: a prompt may have this many characters per allowed token


@dataclass(frozen=True)
class PromptLimit:
    """The longest prompt a task keeps: `max_tokens` counted by `count_tokens` (the policy's
    tokenizer), or, without one, `max_tokens * CHARS_PER_TOKEN_BOUND` characters."""

    max_tokens: int
    count_tokens: Callable[[str], int] | None = None

    @classmethod
    def for_policy(cls, max_prompt_tokens: int | None, policy, max_new_tokens: int) -> PromptLimit:
        """`data.max_prompt_tokens`, or the model's context length minus the rollout cap."""
        if max_prompt_tokens is None:
            context = policy.model.config.max_position_embeddings
            # a cap at or above the context (a long-reasoning recipe on a short-context test model)
            # leaves the context itself as the bound: no prompt can be longer than that
            max_prompt_tokens = context - max_new_tokens if context > max_new_tokens else context
        tokenizer = policy.tokenizer
        return cls(max_prompt_tokens, lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))

    def too_long(self, prompt: str) -> bool:
        if self.count_tokens is None:
            return len(prompt) > self.max_tokens * CHARS_PER_TOKEN_BOUND
        if len(prompt.encode()) + 2 <= self.max_tokens:    # no tokenizer makes more tokens than bytes (+ BOS, a prefix space)
            return False
        return self.count_tokens(prompt) > self.max_tokens

    def describe(self) -> str:
        if self.count_tokens is None:
            return f"{self.max_tokens * CHARS_PER_TOKEN_BOUND} characters ({self.max_tokens} tokens, no tokenizer given)"
        return f"{self.max_tokens} tokens (data.max_prompt_tokens)"

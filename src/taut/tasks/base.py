"""What every task provides: problems with reference answers, and the one verifier that grades them.

A task owns its grader. Rewards, length strategies and evaluation all call `Task.verify`;
nothing else decides whether a response is correct.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")


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
    """A task that knows each problem's minimal necessary response (the testbed)."""

    def analyze(self, problem: Problem, response: str, complete: bool) -> Any:
        """Correctness, redundancy and necessary-step coverage of one response."""
        ...

"""The testbed as a task: prompts, splits, the grader, the oracle and the SFT trace mixture.

Grammar (one word per token):

    prompt    :=  DOMAIN OPERANDS = [budget DIGITS] <think>
    response  :=  STEP* </think> answer DIGITS ROUND* <eos>
    ROUND     :=  check OPERANDS = DIGITS ok

Grading reads the *first* `answer` word of the response and the digits right after it, up to
the first word that is not a digit. Anything written later — post-answer confirmation rounds,
a second `answer` — cannot change the grade: it is generated after the graded digits are fixed.
A response cut before the answer's digits are followed by another word (truncated, or cut at
a token budget) has no answer yet and scores as wrong.

The oracle: on level 1 (single-digit facts) the minimal response is the direct answer
`</think> answer DIGITS <eos>`; from level 2 on it is the necessary steps followed by the answer.
Anything beyond it is redundant: thinking where none is needed (or steps beyond the necessary
ones), and post-answer rounds. The `search` domain has no direct level: its direct answer is a
guess, and its necessary steps are the chain before the gap and the tries up to the first
success (`Instance.necessary_tries`).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from taut.tasks.base import (  # noqa: F401 (re-exported)
    SPLIT_FRACTIONS,
    SPLITS,
    Problem,
    Split,
    TraceAnalysis,
    Verdict,
    check_split,
    split_of,
)
from taut.tasks.gym.domains import (
    DOMAINS,
    HELD_OUT_DOMAINS,
    LEVELS,
    TRAINING_DOMAINS,
    Domain,
    get_domain,
)
from taut.tasks.gym.vocab import ANSWER, END_THINK, THINK

if TYPE_CHECKING:
    from taut.config import MixtureConfig

@dataclass(frozen=True)
class Instance:
    domain: Domain
    level: int
    operands: tuple

    @property
    def key(self) -> str:
        return f"{self.domain.name}:{self.level}:{' '.join(self.domain.operand_words(self.operands))}"

    def prompt(self, budget: int | None = None) -> str:
        words = [self.domain.word, *self.domain.operand_words(self.operands), "="]
        if budget is not None:
            words += ["budget", *str(budget)]
        return " ".join([*words, THINK])

    def to_problem(self) -> Problem:
        return Problem(
            id=self.key,
            prompt=self.prompt(),
            answer=" ".join(self.domain.answer_words(self.operands)),
            domain=self.domain.name,
            difficulty=self.level,
            held_out=self.domain.held_out,
            data=self,
        )

    # ---- traces -----------------------------------------------------------------------
    @property
    def direct(self) -> bool:
        """Whether the minimal response is the direct answer (level 1 of most domains)."""
        return self.level in self.domain.direct_levels

    def necessary_steps(self) -> list[list[str]]:
        return [] if self.direct else self.domain.steps(self.operands)

    @property
    def necessary_tries(self) -> int | None:
        """Search domains: tries up to the first solution; None for domains without a search."""
        return self.domain.tries(self.operands)

    def round_words(self) -> list[str]:
        return self.domain.round_words(self.operands)

    def render(self, think: bool, rounds: int = 0) -> list[str]:
        """A response (without `<eos>`): full steps or a direct answer, then `rounds` rounds."""
        words = [w for step in self.domain.steps(self.operands) for w in step] if think else []
        words += [END_THINK, ANSWER, *self.domain.trace_answer(self.operands)]
        for _ in range(rounds):
            words += self.round_words()
        return words

    def minimal_response(self) -> list[str]:
        return self.render(think=not self.direct)

    def necessary_length(self) -> int:
        """Tokens of the minimal response, `<eos>` included."""
        return len(self.minimal_response()) + 1


def read_answer(words: list[str], complete: bool) -> tuple[str | None, int]:
    """The graded answer (digits after the first `answer`) and the index just past it.

    Returns (None, len(words)) when there is no finished answer: no `answer` word, no digit
    after it, or the digits run to the end of a response that was cut short.
    """
    if ANSWER not in words:
        return None, len(words)
    start = end = words.index(ANSWER) + 1
    while end < len(words) and words[end].isdigit():
        end += 1
    if end == start or (end == len(words) and not complete):
        return None, len(words)
    return " ".join(words[start:end]), end


def analyze(instance: Instance, response: str, complete: bool) -> TraceAnalysis:
    """Oracle view of one response: correctness, redundancy and necessary-step coverage."""
    words = response.split()
    answer, answer_end = read_answer(words, complete)
    # thinking ends at </think>, or where the graded answer starts when </think> is missing
    think_len = words.index(END_THINK) if END_THINK in words else (words.index(ANSWER) if ANSWER in words else len(words))
    necessary = instance.necessary_steps()
    necessary_think = sum(len(step) for step in necessary)
    post_answer = len(words) - answer_end if answer is not None else 0
    extra_thinking = max(0, think_len - necessary_think)
    length = len(words) + int(complete)
    redundant = extra_thinking + post_answer

    coverage = None
    if necessary:
        written = Counter(_split_steps(words[:think_len]))
        wanted = Counter(tuple(step) for step in necessary)
        coverage = sum(min(n, written[s]) for s, n in wanted.items()) / len(necessary)

    return TraceAnalysis(
        answer=answer,
        correct=answer is not None and answer == " ".join(instance.domain.answer_words(instance.operands)),
        length=length,
        necessary_length=instance.necessary_length(),
        redundant_tokens=redundant,
        redundancy=redundant / length if length else 0.0,
        unneeded_thinking=extra_thinking > 0,
        post_answer_rounds=post_answer > 0,
        thinks=think_len > 0,
        coverage=coverage,
    )


def _split_steps(words: list[str]) -> list[tuple[str, ...]]:
    steps, current = [], []
    for w in words:
        current.append(w)
        if w == ";":
            steps.append(tuple(current))
            current = []
    return steps


class GymTask:
    """Testbed problems from one or more domains, graded by the testbed grammar."""

    def __init__(self, domains: list[str] | tuple[str, ...], levels: tuple[int, ...] = LEVELS, name: str | None = None):
        self.domains = tuple(get_domain(d) for d in domains)
        bad = [lv for lv in levels if lv not in LEVELS]
        if bad:
            raise ValueError(f"unknown testbed difficulty {bad}; valid levels: {list(LEVELS)}")
        self.levels = tuple(levels)
        self.name = name or "gym:" + "+".join(d.name for d in self.domains)

    # ---- problems ---------------------------------------------------------------------
    def problems(self, split: Split, n_per_level: int, seed: int = 0) -> list[Problem]:
        check_split(split)
        out = []
        for domain in self.domains:
            for level in self.levels:
                rng = random.Random(f"{seed}:{domain.name}:{level}:{split}")
                out += [i.to_problem() for i in _distinct_instances(domain, level, split, n_per_level, rng)]
        return out

    def sample_instance(self, rng: random.Random, split: Split = "train") -> Instance:
        """One random instance of a split: uniform over this task's domains and levels."""
        domain = rng.choice(self.domains)
        level = rng.choice(self.levels)
        while True:
            instance = Instance(domain, level, domain.sample(rng, level))
            if split_of(instance.key) == split:
                return instance

    # ---- grading ----------------------------------------------------------------------
    def verify(self, problem: Problem, response: str, complete: bool) -> Verdict:
        answer, _ = read_answer(response.split(), complete)
        return Verdict(correct=answer is not None and answer == problem.answer, extracted=answer)

    def analyze(self, problem: Problem, response: str, complete: bool, count=None) -> TraceAnalysis:
        return analyze(_instance(problem), response, complete)          # one word per token: `count` is not needed

    def necessary_length(self, problem: Problem) -> int:
        return _instance(problem).necessary_length()

    def with_budget(self, problem: Problem, budget: int) -> Problem:
        instance = _instance(problem)
        return Problem(**{**problem.__dict__, "prompt": instance.prompt(budget)})


def _instance(problem: Problem) -> Instance:
    if not isinstance(problem.data, Instance):
        raise TypeError(f"problem {problem.id!r} is not a testbed problem")
    return problem.data


def _distinct_instances(domain: Domain, level: int, split: Split, n: int, rng: random.Random) -> list[Instance]:
    """Up to n distinct instances of one split; fewer when the split's space is exhausted
    (level 1 of most domains has only 55-300 problems in all)."""
    found: dict[str, Instance] = {}
    misses = 0
    while len(found) < n and misses < 2000:
        instance = Instance(domain, level, domain.sample(rng, level))
        key = instance.key
        if key in found or split_of(key) != split:
            misses += 1
            continue
        found[key] = instance
        misses = 0
    return sorted(found.values(), key=lambda i: i.key)


def resolve_domains(spec: str) -> list[str]:
    """`gym:add+sum`, `gym:train` (the training domains), `gym:held-out`, `gym:all`, `gym`.

    Groups and names combine with `+`: `gym:train+search` is the training domains and `search`.
    The groups hold the default domains only; an opt-in domain (`search`) is selected by name.
    """
    _, _, rest = spec.partition(":")
    groups = {"": TRAINING_DOMAINS, "train": TRAINING_DOMAINS, "held-out": HELD_OUT_DOMAINS, "all": tuple(DOMAINS)}
    if rest in groups:
        return list(groups[rest])
    named_groups = {k: v for k, v in groups.items() if k}
    names: list[str] = []
    for part in rest.split("+"):
        names += [name for name in named_groups.get(part, (part,)) if name not in names]
    return names


@dataclass(frozen=True)
class TraceMixture:
    """How SFT traces are written: the redundancy the cold start teaches.

    `p_direct`: probability that a trace answers directly (no steps) — on level 1 thinking is then
    pure overhead, on harder levels the steps are necessary.
    `p_direct_easy`: the same probability on problems whose minimal response is the direct answer
    (level 1 of most domains); None: `p_direct` there too. A mixture that answers easy problems
    directly more often than hard ones teaches a choice to think that depends on difficulty.
    `rounds`: probabilities of 0, 1, 2, … post-answer confirmation rounds.
    """

    p_direct: float = 0.5
    rounds: tuple[float, ...] = (0.3, 0.3, 0.4)
    p_direct_easy: float | None = None

    @classmethod
    def from_config(cls, config: MixtureConfig) -> TraceMixture:
        """From a recipe's `data.mixture` section."""
        return cls(config.p_direct, tuple(config.rounds), config.p_direct_easy)

    def render(self, instance: Instance, rng: random.Random) -> list[str]:
        p_direct = self.p_direct_easy if instance.direct and self.p_direct_easy is not None else self.p_direct
        think = rng.random() >= p_direct
        n_rounds = rng.choices(range(len(self.rounds)), weights=self.rounds)[0]
        return instance.render(think=think, rounds=n_rounds)


def sft_examples(task: GymTask, mixture: TraceMixture, rng: random.Random, n: int,
                 split: Split = "train") -> list[tuple[str, str]]:
    """n (prompt, response) pairs from a split, responses written by the mixture."""
    out = []
    for _ in range(n):
        instance = task.sample_instance(rng, split)
        out.append((instance.prompt(), " ".join(mixture.render(instance, rng))))
    return out

"""reasoning-gym tasks: the library's procedural problems, graded by the library's own scorer.

reasoning-gym (PyPI `reasoning-gym`, Apache-2.0; `pip install 'taut[gym]'`) generates problems
for ~100 tasks (`chain_sum`, `gsm_symbolic`, `knights_knaves`, …) from a config and a seed, and
scores an answer with `dataset.score_answer(answer, entry)` — a number in [0, 1], fractional for
some tasks (partial credit). In a recipe:

    data:
      train:
        - reasoning-gym:chain_sum                     # the library's default config, one level
        - task: reasoning-gym:basic_arithmetic
          levels: {1: {min_terms: 2, max_terms: 2}, 2: {min_terms: 3, max_terms: 4}}
        - {task: reasoning-gym:leg_counting, levels: curriculum}   # the library's curriculum
      eval:
        - {task: reasoning-gym:knights_knaves, held_out: true, answer_format: answer-tags}
        - {task: reasoning-gym:basic_arithmetic, answer_format: answer-line, fallback_last_number: false}

Levels. `levels` maps taut difficulty levels to config fields, laid over `config`. `curriculum`
takes the library's curriculum for the task: taut level k is its global level k − 1 (every
attribute at that level, or its highest). Without `levels` the task has one level, 1.
`data.levels` keeps the listed levels a task has.

Prompts. The library's question, followed by one line saying how to write the final answer
(`INSTRUCTIONS`), and only that form is read, after the last `</think>` (a response still inside
`<think>` has no answer):

- `boxed` ("…within \\boxed{}"): the last closed `\\boxed{…}`;
- `answer-tags` ("…between <answer> and </answer>"): the last closed `<answer>…</answer>`;
- `answer-line` ("…on a line of its own as 'Answer: <your answer>'"), for small instruct models
  that do not write `\\boxed{}` (SmolLM2-135M): the rest of the line after the last `Answer:`
  (any case, bold or not: `**Answer:**`, `**Answer**:`), without surrounding whitespace, bold,
  backticks or a closing period; an `Answer:` with nothing after it on its line is no answer.
  A response with no `Answer:` at all answers its last number (`-3`, `2.5`) unless
  `fallback_last_number: false`. A response cut before it ended only counts lines it finished.

`instruction` replaces the format's line with other text (e.g. "Think step by step, then …" for
a study of overthinking); the form read stays the format's. The library's scorer grades the
extracted answer, and `correct` means a score of 1.

No partial credit. Many of the library's scorers give partial credit to an answer that merely
contains the right one (`chain_sum`: "17" for "7" scores 0.5, len(answer) / len(written)), and
a reward that paid it would pay a policy for writing more than the answer. So a score below 1
is wrong, and `Verdict.score` is None: rewards, `score_mean` and evaluation see correctness only.
A task with `partial_credit: true` in its recipe (`ReasoningGymTask(config, partial_credit=True)`) opts in: `Verdict.score` then
keeps the library's score, which the trainer uses as the base reward.

Splits never overlap: each (split, level) draws its problems from a generator seeded for that
split, and a problem is kept only in the split the hash of its question assigns it to (the
testbed's 70 / 10 / 20 % rule) — the same question can never serve two splits. Ids are
`<task name>:<level>:<question hash>`, stable across runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import re
from dataclasses import dataclass
from typing import Any

from taut.config import ReasoningGymTaskConfig
from taut.tasks.base import (
    BUDGET_INSTRUCTION,
    SPLIT_FRACTIONS,
    Problem,
    Split,
    Verdict,
    check_split,
    split_of,
)
from taut.tasks.math import answer_region, last_boxed

PREFIX = "reasoning-gym:"
INSTRUCTIONS = {
    "boxed": "Put your final answer within \\boxed{}.",
    "answer-tags": "Give your final answer between <answer> and </answer>.",
    "answer-line": "Give your final answer on a line of its own as 'Answer: <your answer>'.",
}
CANDIDATES_PER_PROBLEM = 3       # questions generated per wanted problem, over the split's share
_ANSWER_TAGS = re.compile(r"<answer>(.*?)</answer>", re.S)
_ANSWER_MARK = re.compile(r"\banswer(?:\*\*)?[ \t]*:", re.I)      # Answer:, **Answer:**, **Answer**:
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class ReasoningGymError(ValueError):
    """A reasoning-gym task spec the library cannot serve; the message says what to change."""


def require_library() -> None:
    if importlib.util.find_spec("reasoning_gym") is None:
        raise ImportError("reasoning-gym tasks need the gym extra: pip install 'taut[gym]'")


@dataclass(frozen=True)
class Entry:
    """A problem's library entry and the level it was generated at (Problem.data)."""

    level: int
    item: dict[str, Any]


class ReasoningGymTask:
    """Problems of one reasoning-gym task at one or more difficulty levels."""

    def __init__(self, config: ReasoningGymTaskConfig, levels: list[int] | tuple[int, ...] | None = None, *,
                 partial_credit: bool = False):
        require_library()
        self.config = config
        self.partial_credit = partial_credit          # Verdict.score keeps the library's score (module docstring)
        self.library_name = config.task.removeprefix(PREFIX)
        self.name = config.name or self.library_name
        check_name(self.library_name)
        configs = level_configs(config)
        if levels:
            configs = {k: v for k, v in configs.items() if k in set(levels)}
            if not configs:
                raise ReasoningGymError(f"task {config.task!r} has levels {sorted(level_configs(config))}, "
                                        f"none of data.levels {list(levels)}")
        self.level_config = configs
        self._scorers = {level: _dataset(self.library_name, cfg, seed=0, size=1) for level, cfg in configs.items()}

    # ---- problems ---------------------------------------------------------------------
    def problems(self, split: Split, n_per_level: int, seed: int = 0) -> list[Problem]:
        check_split(split)
        out = []
        for level, cfg in self.level_config.items():
            candidates = int(CANDIDATES_PER_PROBLEM * n_per_level / SPLIT_FRACTIONS[split]) + 10
            dataset = _dataset(self.library_name, cfg, seed=_seed(seed, self.library_name, level, split), size=candidates)
            found: dict[str, Problem] = {}
            for index in range(candidates):
                item = dataset[index]
                question = item["question"]
                if split_of(f"{self.library_name}:{question}") != split:     # renaming a task never moves a problem
                    continue
                key = hashlib.blake2b(question.encode(), digest_size=6).hexdigest()
                if key not in found:
                    found[key] = self._problem(level, key, item)
                if len(found) == n_per_level:
                    break
            out += found.values()
        return out

    def _problem(self, level: int, key: str, item: dict[str, Any]) -> Problem:
        answer = item.get("answer")
        instruction = self.config.instruction or INSTRUCTIONS[self.config.answer_format]
        return Problem(id=f"{self.name}:{level}:{key}", prompt=f"{item['question'].rstrip()}\n\n{instruction}",
                       answer="" if answer is None else str(answer), domain=self.name, difficulty=level,
                       held_out=self.config.held_out, data=Entry(level, item))

    # ---- grading ----------------------------------------------------------------------
    def verify(self, problem: Problem, response: str, complete: bool) -> Verdict:
        entry = _entry(problem)
        extracted = extract_answer(response, self.config.answer_format, complete=complete,
                                   fallback_last_number=self.config.reads_last_number)
        if extracted is None:
            return Verdict(correct=False, extracted=None, score=self._credit(0.0))
        try:
            score = float(self._scorers[entry.level].score_answer(extracted, entry.item))
        except Exception as err:      # the library's scorer failed: a verifier error, not a wrong answer
            return Verdict(correct=False, extracted=extracted, score=self._credit(0.0),
                           error=f"reasoning-gym {self.library_name} scorer raised {type(err).__name__}: {str(err)[:200]}")
        return Verdict(correct=score >= 1.0, extracted=extracted, score=self._credit(score))

    def _credit(self, score: float) -> float | None:
        """The partial credit a verdict carries: the library's score where the task opted in."""
        return score if self.partial_credit else None

    def with_budget(self, problem: Problem, budget: int) -> Problem:
        return dataclasses.replace(problem, prompt=f"{problem.prompt}\n\n{BUDGET_INSTRUCTION.format(budget=budget)}")


def extract_answer(response: str, answer_format: str, *, complete: bool, fallback_last_number: bool) -> str | None:
    """The final answer in the format the prompt asked for (module docstring), or None. Only a
    closed box or tag, or a finished line, counts, so a response cut mid-answer has none."""
    region = answer_region(response)
    if region is None:
        return None
    if answer_format == "boxed":
        boxed, unclosed = last_boxed(region)
        return None if unclosed or boxed is None else (boxed.strip() or None)
    if answer_format == "answer-line":
        if not complete and not region.endswith("\n"):
            region = region.rpartition("\n")[0]        # the last line may still be being written
        return _answer_line(region, fallback_last_number)
    tags = _ANSWER_TAGS.findall(region)
    return (tags[-1].strip() or None) if tags else None


def _answer_line(region: str, fallback_last_number: bool) -> str | None:
    """The rest of the line after the last `Answer:`; with none, the last number if asked."""
    marks = list(_ANSWER_MARK.finditer(region))
    if not marks:
        numbers = _NUMBER.findall(region)
        return numbers[-1] if fallback_last_number and numbers else None
    value = region[marks[-1].end():].partition("\n")[0].strip()
    value = value.removesuffix(".").strip().strip("*`").strip()     # "**12**." and "`12`"
    return value.removesuffix(".").rstrip() or None                 # "**12.**"


def level_configs(config: ReasoningGymTaskConfig) -> dict[int, dict[str, Any]]:
    """Config fields per taut level (module docstring)."""
    name = config.task.removeprefix(PREFIX)
    if config.levels is None:
        return {1: dict(config.config)}
    if config.levels == "curriculum":
        from reasoning_gym.factory import create_curriculum, has_curriculum

        if not has_curriculum(name):
            raise ReasoningGymError(f"reasoning-gym task {name!r} has no curriculum: give `levels` as a mapping "
                                    f"level -> config fields")
        curriculum = create_curriculum(name)
        n_levels = max(len(a.levels) for a in curriculum.attributes.values())
        out = {}
        for level in range(1, n_levels + 1):
            curriculum.set_global_level(level - 1)
            generated = dataclasses.asdict(curriculum.generate_configuration(defaults=dict(config.config)))
            out[level] = {k: v for k, v in generated.items() if k not in ("seed", "size")}
        return out
    bad = [k for k in config.levels if k < 1]
    if bad:
        raise ReasoningGymError(f"task {config.task!r}: levels must be integers from 1, got {bad}")
    return {level: {**config.config, **fields} for level, fields in sorted(config.levels.items())}


def _dataset(name: str, fields: dict[str, Any], seed: int, size: int):
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    _, config_cls = DATASETS[name]
    known = {f.name for f in dataclasses.fields(config_cls)} - {"seed", "size"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ReasoningGymError(f"reasoning-gym task {name!r}: unknown config field(s) {unknown}; "
                                f"valid fields: {', '.join(sorted(known))}")
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **fields)
    except (AssertionError, ValueError, TypeError) as err:     # the library validates configs with assert
        raise ReasoningGymError(f"reasoning-gym task {name!r} rejects the config {fields}: "
                                f"{type(err).__name__}: {str(err) or 'a validation assert failed'}") from None


def check_name(name: str) -> None:
    """A reasoning-gym task name the library knows; else an error suggesting the closest ones."""
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        hint = " or ".join(difflib.get_close_matches(name, list(DATASETS), n=3))
        raise ReasoningGymError(f"unknown reasoning-gym task {name!r}"
                                f"{f' (did you mean {hint}?)' if hint else ''}; {len(DATASETS)} tasks are known, "
                                f"e.g. chain_sum, gsm_symbolic, knights_knaves")


def _seed(seed: int, name: str, level: int, split: Split) -> int:
    """A generator seed per (run seed, task, level, split): the splits draw from distinct streams."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{name}:{level}:{split}".encode(), digest_size=4).digest(), "big")


def _entry(problem: Problem) -> Entry:
    if not isinstance(problem.data, Entry):
        raise TypeError(f"problem {problem.id!r} is not a reasoning-gym problem")
    return problem.data

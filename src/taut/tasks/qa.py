"""Short-answer QA: questions from reasoning-gym's non-math families, graded by exact match
(with aliases) of the final answer.

Source: `reasoning-gym` (0.1.25, Apache-2.0; `pip install 'taut[transfer]'`), which generates
its questions procedurally and offline. Families used by default (`FAMILIES`): kinship questions
about a generated family (`family_relationships`: "What is Sarah to Tom?" → "grandmother"),
syllogisms (`syllogism`: "Does it logically follow …?" → "Yes"/"No") and a colour cube turned in
space (`color_cube_rotation`: "What colour is now on the front?" → "blue"). These are
reading-and-reasoning questions with one-word answers, not world-knowledge trivia: no package
reachable offline with a clear license ships a world-knowledge QA set that we found. A spec may
name other reasoning-gym families whose answers are short strings: `qa:family_relationships+syllogism`.
This module uses reasoning-gym's dataset generators only; it is independent of any general
reasoning-gym task spec.

Pool: `POOL_PER_FAMILY` questions per family from the generator seed `GENERATOR_SEED` (pinned),
duplicates and questions whose reference answer reasoning-gym gets wrong (`WRONG_REFERENCES`) dropped, assigned to train / validation / test by a hash of family and question.
`problems(split, n, seed)` returns up to n questions, spread evenly over the families. Domain
`qa`, no difficulty levels; every question is `held_out` (RL recipes never train on it).

Prompt: the family's question, then `ANSWER_FORMAT`. Grading: the final answer is read like a
math answer (`taut.tasks.math.extract_answer`: the last `\\boxed{…}`, else the last
"Answer: …" line, after any thinking), then normalised (`normalize`: case, surrounding
punctuation, quotes and markdown, hyphens, a leading article) and compared with the reference
and its aliases (`ALIASES`: yes/true, no/false).
"""

from __future__ import annotations

import dataclasses
import random
import re
from functools import lru_cache

from taut.tasks.base import BUDGET_INSTRUCTION, Problem, Split, Verdict, check_split, split_of
from taut.tasks.math import extract_answer

FAMILIES = ("family_relationships", "syllogism", "color_cube_rotation")
GENERATOR_SEED = 0
POOL_PER_FAMILY = 200
ANSWER_FORMAT = 'Give your final answer on the last line, in the form "Answer: <answer>".'
ALIASES = {"yes": ("true",), "no": ("false",)}
# reasoning-gym 0.1.25 inverts these family_relationships answers: for "What is A to B?" with B the
# parent of A's spouse it answers B's role (mother-/father-in-law), not A's (son-/daughter-in-law);
# for B an aunt or uncle of A it answers niece/nephew by B's gender, not A's. Those questions are dropped.
WRONG_REFERENCES = {"family_relationships": {"mother-in-law", "father-in-law", "niece", "nephew"}}
_ARTICLE = re.compile(r"^(?:the|a|an)\s+")
_EDGES = " \t\n.,;:!?\"'`*()[]{}"


def normalize(answer: str) -> str:
    """Lowercase, without surrounding punctuation, quotes or markdown, hyphens as spaces, one
    space between words, and no leading article."""
    s = answer.strip().strip(_EDGES).lower().replace("-", " ")
    s = " ".join(s.split())
    return _ARTICLE.sub("", s)


def accepted(reference: str) -> set[str]:
    key = normalize(reference)
    return {key, *ALIASES.get(key, ())}


@lru_cache(maxsize=8)
def pool(families: tuple[str, ...], seed: int = GENERATOR_SEED, size: int = POOL_PER_FAMILY) -> tuple[tuple[str, str, str], ...]:
    """(family, question, answer) for every family: the pinned question pool."""
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError("the qa task needs reasoning-gym: pip install 'taut[transfer]'") from None
    out, seen = [], set()
    for family in families:
        try:
            dataset = reasoning_gym.create_dataset(family, seed=seed, size=size)
        except ValueError as err:
            raise ValueError(f"qa: {err}; known families include {', '.join(FAMILIES)}") from None
        for entry in dataset:
            if not isinstance(entry["answer"], str) or len(entry["answer"].split()) > 4:
                raise ValueError(f"qa: family {family!r} does not have short string answers "
                                 f"(got {entry['answer']!r}); choose a short-answer family such as {', '.join(FAMILIES)}")
            key = (family, entry["question"])
            if entry["answer"] in WRONG_REFERENCES.get(family, ()):
                continue
            if key not in seen:
                seen.add(key)
                out.append((family, entry["question"], entry["answer"]))
    return tuple(out)


class QATask:
    """Short-answer questions from reasoning-gym families, exact match with aliases."""

    def __init__(self, families: tuple[str, ...] = FAMILIES):
        if not families:
            raise ValueError("qa: name at least one family, e.g. qa:family_relationships")
        self.families = tuple(families)
        self.name = "qa" if self.families == FAMILIES else "qa:" + "+".join(self.families)
        self.questions = pool(self.families)

    def problems(self, split: Split, n_per_level: int, seed: int = 0) -> list[Problem]:
        check_split(split)
        per_family: dict[str, list[int]] = {f: [] for f in self.families}
        for i, (family, question, _) in enumerate(self.questions):
            if split_of(f"qa:{family}:{question}") == split:
                per_family[family].append(i)
        rng = random.Random(f"{seed}:{self.name}:{split}")
        for members in per_family.values():
            rng.shuffle(members)
        chosen: list[int] = []
        while len(chosen) < n_per_level and any(per_family.values()):   # round robin over the families
            for members in per_family.values():
                if members and len(chosen) < n_per_level:
                    chosen.append(members.pop())
        return [self._problem(i) for i in sorted(chosen)]

    def _problem(self, i: int) -> Problem:
        family, question, answer = self.questions[i]
        return Problem(id=f"qa:{family}:{i}", prompt=f"{question}\n\n{ANSWER_FORMAT}", answer=answer, domain="qa",
                       held_out=True, data=family)

    def verify(self, problem: Problem, response: str, complete: bool) -> Verdict:
        extracted = extract_answer(response, complete)
        if extracted is None:
            return Verdict(correct=False, extracted=None)
        return Verdict(correct=normalize(extracted) in accepted(problem.answer), extracted=extracted)

    def with_budget(self, problem: Problem, budget: int) -> Problem:
        return dataclasses.replace(problem, prompt=f"{problem.prompt}\n\n{BUDGET_INSTRUCTION.format(budget=budget)}")

"""Instruction following: verifiable prompts in the manner of IFEval (Zhou et al. 2023,
arXiv 2311.07911), scored by IFEval's own instruction checkers, strict and loose.

Source. IFEval's 541 prompts are not shipped by any package reachable offline (`if-verifiable`
fetches them from a hub). Its checkers are: `if-verifiable` (0.1.2, Apache-2.0; Google's
instruction code, `if_verifiable.ifeval`) ships them, and taut depends on it
(`pip install 'taut[transfer]'`); nothing is copied. The prompts are built here: a base request
(`BASE_REQUESTS`, written for taut) followed by the descriptions of 1–3 checkers, their
arguments drawn by the checkers' own generators, combinations that IFEval marks as conflicting
excluded. A fixed pool of `POOL_SIZE` prompts comes from `GENERATOR_SEED` (pinned: the same
package version gives the same prompts on every machine), assigned to train / validation / test
by a hash of their id. These are *not* the IFEval prompts: scores are comparable between taut
runs, not with published IFEval numbers.

Checkers left out, because they need nltk's punkt data, which nltk downloads at run time and no
package we checked ships (docs/transfer.md): `length_constraints:number_sentences` (punkt sentence
splitter) and `change_case:capital_word_frequency` (nltk.word_tokenize). Every other IFEval
checker in the registry is used. `language:response_language` uses langdetect, seeded here
(`DetectorFactory.seed = 0`) so that its verdicts are deterministic.

Scoring (if-verifiable's `evaluate_instructions`, IFEval's definitions): a response's thinking
(up to `</think>`) is dropped; *strict* checks the response as written, *loose* also accepts it
with its first and/or last line removed or without markdown asterisks. `Verdict.correct` is
prompt-level strict accuracy (every instruction followed); `scores()` adds prompt-level loose
and instruction-level strict / loose. A response cut before it ended scores zero everywhere
(taut's rule for every task: an answer still being written does not count).

Spec: `ifeval`. Domain `ifeval`, no difficulty levels; `n_per_level` is the number of prompts.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from functools import lru_cache

from taut.tasks.base import BUDGET_INSTRUCTION, Problem, Split, Verdict, check_split, split_of
from taut.tasks.math import answer_region

GENERATOR_SEED = 0
POOL_SIZE = 600
INSTRUCTION_COUNTS = (1, 1, 2, 2, 3)          # IFEval prompts carry 1–3 instructions, mostly 1 or 2
EXCLUDED = {
    "length_constraints:number_sentences": "needs nltk's punkt sentence tokenizer (data not shipped by a package)",
    "change_case:capital_word_frequency": "needs nltk.word_tokenize (punkt data not shipped by a package)",
}
REPEAT_PROMPT = "combination:repeat_prompt"

BASE_REQUESTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how photosynthesis works to a twelve-year-old.",
    "Write a product description for a reusable water bottle.",
    "Describe the water cycle.",
    "Write a cover letter for a job as a librarian.",
    "Give advice to someone who is starting to learn the guitar.",
    "Write a poem about autumn in a big city.",
    "Summarize the main causes of the French Revolution.",
    "Write a blog post about the benefits of walking every day.",
    "Explain what a black hole is.",
    "Write a letter to a friend inviting them to a picnic.",
    "Describe your ideal weekend.",
    "Write a review of an imaginary restaurant that serves only soup.",
    "Explain the difference between weather and climate.",
    "Write a speech for the opening of a new public park.",
    "Give tips for preparing for a job interview.",
    "Write a short biography of an invented inventor.",
    "Explain how a bicycle works.",
    "Write an advertisement for a small bakery.",
    "Describe the life cycle of a butterfly.",
    "Write a rap about recycling.",
    "Explain why the sky is blue.",
    "Write an email to a landlord asking to fix a leaking tap.",
    "Plan a three-day trip to the mountains.",
    "Write a dialogue between a cat and a dog about who is the better pet.",
    "Explain how vaccines train the immune system.",
    "Write a limerick about a forgetful wizard.",
    "Describe how to make a cup of tea.",
    "Write a news report about a town that won a gardening contest.",
    "Explain what inflation is and why it matters.",
    "Write a pitch for a mobile app that helps people drink more water.",
    "Give an overview of how the internet delivers a web page.",
    "Write a thank-you note to a teacher.",
    "Describe the rules of chess to a beginner.",
    "Write a riddle about time and explain its answer.",
    "Explain the importance of sleep for students.",
)


@dataclass(frozen=True)
class Instance:
    base: str
    instruction_ids: tuple[str, ...]
    kwargs: tuple[dict, ...]
    prompt: str


def registry() -> dict:
    """IFEval's checkers (from if-verifiable), without the excluded ones."""
    try:
        import langdetect
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_CONFLICTS, INSTRUCTION_DICT
    except ImportError as err:
        raise ImportError(f"the ifeval task needs if-verifiable: pip install 'taut[transfer]' ({err})") from None
    langdetect.DetectorFactory.seed = 0
    checkers = {k: v for k, v in INSTRUCTION_DICT.items() if k not in EXCLUDED}
    return {"checkers": checkers, "conflicts": INSTRUCTION_CONFLICTS}


def _conflict(a: str, b: str, conflicts: dict) -> bool:
    return b in conflicts.get(a, set()) or a in conflicts.get(b, set())


def build_instance(rng: random.Random, checkers: dict, conflicts: dict) -> Instance:
    """One prompt: a base request and 1–3 compatible instructions with their arguments."""
    base = rng.choice(BASE_REQUESTS)
    wanted = rng.choice(INSTRUCTION_COUNTS)
    ids: list[str] = []
    for candidate in rng.sample(sorted(checkers), len(checkers)):
        if len(ids) == wanted:
            break
        if all(not _conflict(candidate, chosen, conflicts) for chosen in ids):
            ids.append(candidate)
    descriptions, kwargs = [], []
    for instruction_id in ids:
        checker = checkers[instruction_id](instruction_id)
        # the checkers draw their own arguments from the global `random`: seed it from rng, then restore it
        state = random.getstate()
        random.seed(rng.getrandbits(64))
        try:
            given = {"prompt_to_repeat": base} if instruction_id == REPEAT_PROMPT else {}
            descriptions.append(checker.build_description(**given))
            kwargs.append(dict(checker.get_instruction_args() or {}))
        finally:
            random.setstate(state)
    prompt = " ".join([base, *descriptions])
    return Instance(base, tuple(ids), tuple(kwargs), prompt)


@lru_cache(maxsize=4)
def pool(seed: int = GENERATOR_SEED, size: int = POOL_SIZE) -> tuple[Instance, ...]:
    """The pinned prompt pool: the same seed and package version give the same prompts."""
    reg = registry()
    rng = random.Random(f"taut-ifeval:{seed}")
    return tuple(build_instance(rng, reg["checkers"], reg["conflicts"]) for _ in range(size))


def score(instance: Instance, response: str) -> dict[str, float]:
    """IFEval's four numbers for one response (if-verifiable's `evaluate_instructions`)."""
    from if_verifiable.common import evaluate_instructions

    results, scores = evaluate_instructions(response, list(instance.instruction_ids), [dict(k) for k in instance.kwargs],
                                            instance.prompt, registry()["checkers"])
    if results and len(results) != len(instance.instruction_ids):
        raise RuntimeError(f"if-verifiable skipped instructions of {instance.instruction_ids}: "
                           f"checked {[r.instruction_id for r in results]}")
    return {"prompt_strict": scores.binary_strict, "prompt_loose": scores.binary_loose,
            "instruction_strict": scores.partial_strict, "instruction_loose": scores.partial_loose}


class IfevalTask:
    """Verifiable instruction-following prompts, scored by IFEval's checkers."""

    name = "ifeval"

    def __init__(self, seed: int = GENERATOR_SEED, size: int = POOL_SIZE):
        self.instances = pool(seed, size)

    def problems(self, split: Split, n_per_level: int, seed: int = 0) -> list[Problem]:
        check_split(split)
        members = [i for i, inst in enumerate(self.instances) if split_of(f"{self.name}:{i}") == split]
        if len(members) > n_per_level:
            members = sorted(random.Random(f"{seed}:{self.name}:{split}").sample(members, n_per_level))
        return [Problem(id=f"{self.name}:{i}", prompt=self.instances[i].prompt, answer=", ".join(self.instances[i].instruction_ids),
                        domain="ifeval", held_out=True, data=self.instances[i]) for i in members]

    def scores(self, problem: Problem, response: str, complete: bool) -> dict[str, float]:
        if not complete:
            return {"prompt_strict": 0.0, "prompt_loose": 0.0, "instruction_strict": 0.0, "instruction_loose": 0.0}
        return score(problem.data, response)

    def verify(self, problem: Problem, response: str, complete: bool) -> Verdict:
        s = self.scores(problem, response, complete)
        return Verdict(correct=s["prompt_strict"] == 1.0, extracted=answer_region(response) if complete else None)

    def with_budget(self, problem: Problem, budget: int) -> Problem:
        return dataclasses.replace(problem, prompt=f"{problem.prompt}\n\n{BUDGET_INSTRUCTION.format(budget=budget)}")

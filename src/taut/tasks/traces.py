"""SFT examples from the tasks a config names (`data.sft`): the cold start's data, and what the
preflight measures its memory with."""

from __future__ import annotations

import random

from taut.config import RunConfig
from taut.tasks import load_task
from taut.tasks.base import Split, TraceTask
from taut.tasks.files import FileTask
from taut.tasks.gym.task import GymTask, TraceMixture, resolve_domains
from taut.tasks.gym.task import sft_examples as gym_examples


def sft_examples(config: RunConfig, rng: random.Random, n: int, split: Split = "train") -> list[tuple[str, str]]:
    """n (prompt, response) pairs from the SFT tasks (`data.sft`), from `split` (validation: the
    held-back traces of the validation loss).

    Testbed specs (gym:…) together form one source, whose traces the trace mixture writes; a
    written-arithmetic spec (written:…) is a source whose traces its redundancy mixture writes; every
    data file is another source, sampled uniformly (with replacement) from its train-split rows'
    responses (`columns.response`). With several sources, each pair picks its source uniformly.
    """
    gym_specs = [s for s in config.data.sft if isinstance(s, str) and s.startswith("gym")]
    sources: list = []
    if gym_specs:
        domains = [d for spec in gym_specs for d in resolve_domains(spec)]
        task = GymTask(domains, **({"levels": tuple(config.data.levels)} if config.data.levels else {}))
        mixture = TraceMixture.from_config(config.data.mixture)
        sources.append(lambda k: gym_examples(task, mixture, rng, k, split))
    for spec in config.data.sft:
        if isinstance(spec, str) and spec.startswith("gym"):
            continue
        task = load_task(spec, config.data.levels)
        if isinstance(task, TraceTask):                # a task that writes its own traces (written arithmetic)
            sources.append(lambda k, task=task: task.sft_examples(rng, k, split=split))
            continue
        if not isinstance(task, FileTask):
            raise ValueError(f"SFT data must be testbed tasks (gym:…), written arithmetic (written:…) or data files "
                             f"with a response column, got {spec!r}")
        pairs = task.sft_pairs(split)
        if not pairs:                     # a file without validation rows adds nothing to the validation loss
            continue
        sources.append(lambda k, pairs=pairs: [rng.choice(pairs) for _ in range(k)])
    if not sources:
        if split != "train":
            return []
        raise ValueError("data.sft lists no tasks")
    if len(sources) == 1:
        return sources[0](n)
    picks = [rng.randrange(len(sources)) for _ in range(n)]
    return [pair for i, source in enumerate(sources) for pair in source(picks.count(i))]

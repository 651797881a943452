"""Training prompts: a fixed pool drawn in shuffled epochs, or a phase's mastered/unmastered mix."""

from __future__ import annotations

import numpy as np

from taut.config import RunConfig, SamplerConfig
from taut.curriculum import MasteryTracker, draw_mixture, mixture_share
from taut.tasks import Problem, Task, load_task


class PromptPool:
    """Training problems visited in epochs, each epoch in a fresh order seeded by (seed, epoch)."""

    def __init__(self, items: list[tuple[Task, Problem]], seed: int):
        if not items:
            raise ValueError("the RL prompt pool is empty: check data.train and data.levels")
        self.items = items
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> list[int]:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.items)).tolist()

    def next(self, n: int) -> list[tuple[Task, Problem]]:
        out = []
        for _ in range(n):
            if self.position == len(self.items):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffle(self.epoch)
            out.append(self.items[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffle(self.epoch)


def build_pool(config: RunConfig, prompt_limit=None) -> PromptPool:
    """The train-split problems of `data.train`; data files skip prompts over `prompt_limit`."""
    items = []
    for spec in config.data.train:
        task = load_task(spec, config.data.levels, prompt_limit)
        items += [(task, p) for p in task.problems("train", config.data.pool_per_level, config.data.seed) if not p.held_out]
    return PromptPool(items, config.seed)


class Sampler:
    """Draws training prompts: shuffled epochs of the pool, or the phase's mastered/unmastered mix."""

    def __init__(self, pool: PromptPool, tracker: MasteryTracker, seed: int):
        self.pool, self.tracker = pool, tracker
        self.rng = np.random.default_rng([seed, 7])
        self.config: SamplerConfig | None = None

    def __call__(self, n: int) -> list[tuple[Task, Problem]]:
        cfg = self.config
        if cfg is None or cfg.mastered_fraction is None:
            return self.pool.next(n)
        ids = [p.id for _, p in self.pool.items]
        mastered = [self.tracker.mastered(i, cfg.mastery_threshold) for i in ids]
        share = mixture_share(cfg, sum(mastered) / len(mastered))
        return [self.pool.items[i] for i in draw_mixture(ids, mastered, n, share, self.rng)]

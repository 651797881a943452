"""Tasks: problems plus the one verifier that grades them.

Task specs in recipes:
    gym:add, gym:add+sum      testbed domains
    gym:train / gym           the testbed's training domains
    gym:held-out              the held-out domains (never trained on by RL recipes)
    gym:all                   every testbed domain
"""

from __future__ import annotations

from collections.abc import Callable

from taut.tasks.base import Problem, Split, Task, Verdict

TaskFactory = Callable[[str, "list[int] | None"], Task]
_FACTORIES: dict[str, TaskFactory] = {}


def register_task(kind: str, factory: TaskFactory) -> None:
    """Make `kind:…` specs resolve through `factory(spec, levels)` (custom tasks, tests)."""
    _FACTORIES[kind] = factory


def _gym(spec: str, levels: list[int] | None) -> Task:
    from taut.tasks.gym.task import GymTask, resolve_domains

    kwargs = {"levels": tuple(levels)} if levels else {}
    return GymTask(resolve_domains(spec), name=spec, **kwargs)


register_task("gym", _gym)


def load_task(spec: str, levels: list[int] | None = None) -> Task:
    kind, _, _ = spec.partition(":")
    if kind not in _FACTORIES:
        raise ValueError(f"unknown task {spec!r}; known kinds: {', '.join(f'{k}:…' for k in _FACTORIES)}")
    return _FACTORIES[kind](spec, levels)


__all__ = ["Problem", "Split", "Task", "Verdict", "load_task", "register_task"]

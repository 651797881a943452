"""Tasks: problems plus the one verifier that grades them.

Task specs in recipes:
    gym:add, gym:add+sum      testbed domains
    gym:train / gym           the testbed's training domains
    gym:held-out              the held-out domains (never trained on by RL recipes)
    gym:all                   every testbed domain
    file:PATH                 a data file with the default columns (prompt, answer) and the math verifier
    {path: …, columns: …}     a data file described by a `FileTaskConfig` (see taut.tasks.files)
    code:humaneval            HumanEval, run in the sandbox (taut.tasks.code)      } unseen suites for
    ifeval                    verifiable instructions, IFEval's checkers (…ifeval) } transfer evaluation
    qa, qa:FAMILY+FAMILY      short-answer QA from reasoning-gym (taut.tasks.qa)   } (docs/transfer.md)
    written, written:FAMILY   taut's written arithmetic with an oracle (columns, stories; times held
                              out; written:all = the three) (see taut.tasks.written)
    written2, written2:FAMILY the same problems with their steps in format 2 (every column alike,
                              stories worked digit by digit); written3: format 2 with the columns
                              named before the first
    reasoning-gym:NAME        a reasoning-gym task; {task: reasoning-gym:NAME, config: …, levels: …}
                              gives its settings (see taut.tasks.reasoning_gym)
"""

from __future__ import annotations

from collections.abc import Callable

from taut.config import FileTaskConfig, ReasoningGymTaskConfig, TaskSpec
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


def _file(spec: str, levels: list[int] | None) -> Task:
    return _file_task(FileTaskConfig(path=spec.partition(":")[2]), levels)


def _file_task(config: FileTaskConfig, levels: list[int] | None, prompt_limit=None) -> Task:
    from taut.tasks.files import FileTask

    return FileTask(config, levels, prompt_limit)


def _suite(spec: str, levels: list[int] | None) -> Task:
    """The transfer suites (docs/transfer.md); they have no difficulty levels."""
    kind, _, rest = spec.partition(":")
    if levels:
        raise ValueError(f"data.levels is set but task {spec!r} has no difficulty levels: unset data.levels")
    if kind == "code":
        from taut.tasks.code import CodeTask

        return CodeTask(rest)
    if kind == "ifeval":
        from taut.tasks.ifeval import IfevalTask

        if rest:
            raise ValueError(f"unknown task {spec!r}: the instruction-following suite is spelled `ifeval`")
        return IfevalTask()
    from taut.tasks.qa import FAMILIES, QATask

    return QATask(tuple(rest.split("+")) if rest else FAMILIES)


def _reasoning_gym(spec: str | ReasoningGymTaskConfig, levels: list[int] | None) -> Task:
    from taut.tasks.reasoning_gym import ReasoningGymTask

    config = spec if isinstance(spec, ReasoningGymTaskConfig) else ReasoningGymTaskConfig(task=spec)
    return ReasoningGymTask(config, levels, partial_credit=config.partial_credit)


register_task("gym", _gym)
register_task("file", _file)
for _kind in ("code", "ifeval", "qa"):
    register_task(_kind, _suite)
def _written(spec: str, levels: list[int] | None) -> Task:
    from taut.tasks.written import load

    return load(spec, levels)


register_task("reasoning-gym", _reasoning_gym)
register_task("written", _written)
register_task("written2", _written)
register_task("written3", _written)


def load_task(spec: TaskSpec, levels: list[int] | None = None, prompt_limit=None) -> Task:
    """The task a recipe names: a `kind:…` string or a data file's `FileTaskConfig`.
    `prompt_limit` (a `taut.tasks.base.PromptLimit`) makes a data file skip over-long prompts."""
    if isinstance(spec, FileTaskConfig):
        return _file_task(spec, levels, prompt_limit)
    if isinstance(spec, ReasoningGymTaskConfig):
        return _reasoning_gym(spec, levels)
    kind, _, rest = spec.partition(":")
    if kind == "file" and prompt_limit is not None:
        return _file_task(FileTaskConfig(path=rest), levels, prompt_limit)
    if kind not in _FACTORIES:
        raise ValueError(f"unknown task {spec!r}; known kinds: {', '.join(f'{k}:…' for k in _FACTORIES)}, "
                         f"or a data file given as {{path: …, columns: …}}")
    return _FACTORIES[kind](spec, levels)


__all__ = ["Problem", "Split", "Task", "Verdict", "load_task", "register_task"]

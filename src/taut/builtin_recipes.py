"""The recipes shipped inside the package (`src/taut/recipes/`, also `recipes/` in the repository),
named `builtin:<name>` on the command line: `builtin:grpo`, `builtin:real/siri-r1-distill-1.5b`."""

from __future__ import annotations

import difflib
from pathlib import Path

RECIPES = Path(__file__).parent / "recipes"
PREFIX = "builtin:"


def resolve_recipe(spec: str | Path) -> Path:
    """A recipe path, with `builtin:<name>` mapped to the shipped file. A missing file is an
    error that names it and, for a built-in name, the valid ones."""
    text = str(spec)
    if text.startswith(PREFIX):
        name = text.removeprefix(PREFIX).removesuffix(".yaml")
        path = RECIPES / f"{name}.yaml"
        if not path.is_file():
            close = difflib.get_close_matches(f"{PREFIX}{name}", builtin_names(), n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise FileNotFoundError(f"no built-in recipe {text!r}{hint}; built-in recipes: {', '.join(builtin_names())}")
        return path
    path = Path(spec)
    if not path.is_file():
        if path.is_dir():
            raise FileNotFoundError(f"recipe {text} is a directory, not a recipe file")
        shipped = shipped_as(path)
        hint = f"; the same recipe ships with taut as {shipped}" if shipped else \
            "; the shipped ones are builtin:<name> (list: taut recipes)"
        raise FileNotFoundError(f"recipe {text} not found (in {Path.cwd()}){hint}")
    return path


def shipped_as(path: Path) -> str | None:
    """The builtin name of a repository path such as `recipes/real/x.yaml`, if taut ships it."""
    parts = path.with_suffix(".yaml").parts
    if "recipes" not in parts:
        return None
    name = Path(*parts[len(parts) - parts[::-1].index("recipes"):]).with_suffix("").as_posix()
    return f"{PREFIX}{name}" if (RECIPES / f"{name}.yaml").is_file() else None


def builtin_names() -> list[str]:
    return [f"{PREFIX}{p.relative_to(RECIPES).with_suffix('').as_posix()}" for p in sorted(RECIPES.rglob("*.yaml"))]


def summary(path: Path) -> str:
    """A recipe's first comment line (what it is), without the `#`."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""

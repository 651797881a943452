"""A built wheel, installed into a fresh virtual environment outside the repository, runs the
shipped recipes. Nothing is downloaded: the wheel is built without build isolation and installed
without dependencies; torch and the rest come from this interpreter's site-packages by path."""

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


CLEAN = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}      # nothing from a source tree


def run(*args, cwd, env=CLEAN):
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{args}: {proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_taut_is_a_regular_package():
    import taut  # a namespace package (no __init__.py) has no __file__

    assert taut.__file__ and Path(taut.__file__).name == "__init__.py" and taut.__doc__


@pytest.mark.slow
def test_the_wheel_installed_in_a_fresh_venv_runs_outside_the_repository(tmp_path):
    source = tmp_path / "source"             # a copy: no build/ left in the tree, no stale files in the wheel
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", wheels,
        source, cwd=tmp_path)
    (wheel,) = wheels.glob("taut-*.whl")
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--quiet", wheel, cwd=tmp_path)
    # this interpreter's packages (torch, typer, …) by path: a plain path entry runs no .pth
    # file there, so a development install of taut in it stays out of the way
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip())
    (site / "parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = CLEAN
    taut = env_dir / "bin" / "taut"

    where = run(python, "-c", "import taut.cli; print(taut.cli.__file__)", cwd=work, env=env)
    assert where.startswith(str(site)), where
    package = run(python, "-c", "import taut; print(taut.__file__)", cwd=work, env=env).strip()
    assert package == str(site / "taut" / "__init__.py"), package           # a regular package, not a namespace
    assert run(taut, "--version", cwd=work, env=env).startswith("taut ")
    assert "--dry-run" in run(taut, "demo", "--help", cwd=work, env=env)
    plan = run(taut, "train", "--config", "builtin:grpo", "--dry-run", cwd=work, env={**env, "COLUMNS": "100"})
    assert "plan: " in plan and "prompts_per_step" in plan
    listed = run(taut, "recipes", cwd=work, env={**env, "COLUMNS": "100"})
    assert "builtin:demo" in listed and "builtin:real/siri-r1-distill-1.5b" in listed
    assert "compression" in run(taut, "demo", "--dry-run", cwd=work, env=env)
    # every shipped recipe validates there, with the command it is for
    for name in [line.split()[0] for line in listed.splitlines() if line.startswith("builtin:")]:
        if name.removeprefix("builtin:").startswith("bench"):
            continue                                         # a matrix of runs: tests/test_recipes.py parses it
        command = "sft" if "sft" in name.split("/")[-1].split("-")[:2] else "train"
        run(taut, command, "--config", name, "--dry-run", cwd=work, env=env)
    # the shipped data file the r1-distill recipes train on is in the wheel
    rows = run(python, "-c", "from taut.builtin_recipes import resolve_recipe; from taut.config import load_config; "
               "from taut.tasks.files import read_rows; "
               "print(len(read_rows(load_config(resolve_recipe('builtin:real/siri-r1-distill-1.5b')).data.train[0])))",
               cwd=work, env=env)
    assert int(rows) == 41
    # an evaluation of a shipped model goes to the current directory, not into the installed package
    run(taut, "eval", "builtin:testbed-sft", "--tasks", "gym:add", "--set", "eval.n_per_level=1", "--quiet", cwd=work, env=env)
    assert (work / "runs" / "eval" / "testbed-sft.json").is_file() and not (site / "taut" / "assets" / "testbed-sft" / "eval").exists()

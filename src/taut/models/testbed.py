"""The testbed's tiny Qwen2 policies, built from a config with random weights (docs/testbed.md)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from taut.models.policy import Policy
from taut.tasks.gym.vocab import build_tokenizer

ASSETS = Path(__file__).parent.parent / "assets"       # built-in models (`model.path: builtin:<name>`)

# Testbed model sizes: hidden, layers, heads, FFN. tiny = the prototype's 0.53M model.
PRESETS = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=512),
    "small": dict(hidden_size=192, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=6, intermediate_size=768),
}


def build_testbed_model(preset: str, seed: int = 0) -> Policy:
    """A Qwen2-architecture model with random weights and the testbed tokenizer."""
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

"""Rollout engines: batched sampling behind one interface.

`HFEngine` (the default) samples from any Hugging Face causal LM with a KV cache managed by
taut. `VLLMEngine` (GPU extra: vllm itself is imported when such an engine is built) does the same
through vLLM. `base.py` holds what they share.
"""

from __future__ import annotations

import torch

from taut.rollout.base import RolloutEngine, Rollouts, SamplingParams
from taut.rollout.hf import HFEngine
from taut.rollout.vllm import (
    VLLMEngine,  # importable without vLLM: it imports vllm when an engine is built
)

__all__ = ["HFEngine", "RolloutEngine", "Rollouts", "SamplingParams", "VLLMEngine", "build_engine"]


def build_engine(kind: str, policy, max_rows: int = 1024, fast: bool = True, logprobs: bool = False,
                 dtype: str = "auto") -> RolloutEngine:
    """The rollout engine named in `rl.engine` for a policy (vLLM is imported only when asked for).

    `logprobs`: the engine will be asked for sampled tokens' log-probs (vLLM must be built for it;
    `HFEngine` records them whenever `SamplingParams.logprobs` is set). `dtype` (`rl.rollout_dtype`):
    `auto` generates in the policy's precision; `bf16` under bf16 autocast whatever the policy's
    own (fp32 weights, bf16 products: the arithmetic of `bf16-mixed` generation)."""
    if dtype not in ("auto", "bf16"):
        raise ValueError(f"unknown rollout dtype {dtype!r}; valid: auto, bf16")
    if kind == "hf":
        autocast = policy.autocast
        if dtype == "bf16":
            def autocast():
                return torch.autocast(policy.model.device.type, dtype=torch.bfloat16)
        return HFEngine(policy.model, policy.eos_id, policy.pad_id, max_rows=max_rows, fast=fast, autocast=autocast)
    if kind == "vllm":
        return VLLMEngine(policy, max_rows=max_rows, logprobs=logprobs)
    raise ValueError(f"unknown rollout engine {kind!r}; valid engines: hf, vllm")

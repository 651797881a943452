"""SIRI inside TRL's GRPOTrainer: an oscillating rollout cap and the length-capping reward.

    L(t)  from a schedule (cosine, stair, stair-cosine), set before every step by LengthCapCallback
    r_i = 1[correct_i] · 1[not truncated_i]      computed by taut's own `siri` strategy

CPU, the shipped testbed SFT model (`builtin:testbed-sft`; about 10 seconds for 8 steps: the
log's `reward` and `grad_norm` move as the cap falls from 64 to 24 tokens and rises again):

    OMP_NUM_THREADS=1 python examples/trl_siri.py

A real run: a model directory (a `taut sft` run, or any causal LM with a chat template) on GPUs,
with TRL's usual launchers (docs/engines.md):

    accelerate launch --num_processes 8 examples/trl_siri.py --model runs/sft --task gym:train \\
        --steps 400 --l-max 128 --l-min 48 --period 100 --num-generations 8 --per-device-batch 8
"""

from __future__ import annotations

import argparse

import torch
from trl import GRPOConfig, GRPOTrainer

from taut.config import ModelConfig
from taut.integrations.trl import LengthCapCallback, StrategyReward, TaskVerifier, eos_token_ids, problems_dataset
from taut.length.siri import SiriConfig
from taut.models import load_policy
from taut.tasks import load_task


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="builtin:testbed-sft",
                   help="model directory, or builtin:testbed-sft (default: the shipped testbed SFT model)")
    p.add_argument("--task", default="gym:train", help="a taut task spec (gym:train, gym:add, …)")
    p.add_argument("--problems-per-level", type=int, default=8)
    p.add_argument("--schedule", default="cosine", choices=["cosine", "stair", "stair-cosine"])
    p.add_argument("--l-max", type=int, default=64)
    p.add_argument("--l-min", type=int, default=24)
    p.add_argument("--period", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--per-device-batch", type=int, default=8, help="completions per process and step")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--vllm-mode", choices=["colocate", "server"], default=None,
                   help="generate with vLLM (GPU only; not exercised by taut's CPU tests)")
    p.add_argument("--output-dir", default="runs/trl-siri")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    on_gpu = torch.cuda.is_available()
    policy = load_policy(ModelConfig(path=args.model, device="cpu", dtype="float32"), seed=args.seed)   # the trainer places it
    task = load_task(args.task)
    dataset = problems_dataset(task.problems("train", args.problems_per_level, seed=args.seed),
                               conversational=policy.chat)

    siri = SiriConfig(schedule=args.schedule, l_max=args.l_max, l_min=args.l_min, period=args.period)
    config = GRPOConfig(
        output_dir=args.output_dir,
        use_cpu=not on_gpu, bf16=on_gpu, gradient_checkpointing=False, report_to="none",
        use_vllm=args.vllm_mode is not None, vllm_mode=args.vllm_mode or "colocate",
        beta=0.0,                                   # no KL term, no reference model (taut's default)
        num_generations=args.num_generations,
        per_device_train_batch_size=args.per_device_batch,
        max_completion_length=siri.l_max,           # the schedule's ceiling (dr_grpo normaliser, vLLM context)
        max_steps=args.steps, learning_rate=args.lr, logging_steps=1, save_strategy="no", seed=args.seed,
    )
    reward = StrategyReward(
        siri, TaskVerifier(args.task),
        num_generations=args.num_generations, max_completion_length=siri.l_max,
        eos_token_id=eos_token_ids(policy.model, policy.tokenizer),
    )
    trainer = GRPOTrainer(model=policy.model, reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=policy.tokenizer)
    cap = LengthCapCallback(trainer, siri)
    trainer.add_callback(cap)
    trainer.train()
    trainer.save_model(args.output_dir)
    if trainer.accelerator.is_main_process:
        print("caps by step:", cap.applied)

    if torch.distributed.is_initialized():       # a clean exit under accelerate launch / torchrun
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

"""Mastery-gated compression inside TRL's GRPOTrainer.

For each prompt's group of G completions (gathered across processes, so groups split over
ranks are scored whole), taut's `mastery-gated` strategy penalises correct completions longer
than the group's shortest correct one, only when the group's pass rate is at least τ:

    r_i = c_i − 1[p ≥ τ] · c_i · 1[ℓ_i > s] · min(P_max, α · (ℓ_i − s) / s),   s = (1 + slack) · shortest correct ℓ

Optionally under a SIRI cap (`--siri`), as in SIRI's schedule plus a group-aware penalty.

CPU, the shipped testbed SFT model (`builtin:testbed-sft`; about 10 seconds for 8 steps: the
log's `reward` and `grad_norm` move, and groups the model solves get the penalty):

    OMP_NUM_THREADS=1 python examples/trl_mastery.py

A real run on GPUs (docs/engines.md):

    accelerate launch --num_processes 8 examples/trl_mastery.py --model runs/sft --task gym:train \\
        --steps 300 --max-completion-length 128 --num-generations 8 --per-device-batch 8
"""

from __future__ import annotations

import argparse

import torch
from trl import GRPOConfig, GRPOTrainer

from taut.config import ModelConfig
from taut.integrations.trl import LengthCapCallback, StrategyReward, TaskVerifier, eos_token_ids, problems_dataset
from taut.length.mastery import MasteryGatedConfig
from taut.length.siri import SiriConfig
from taut.models import load_policy
from taut.tasks import load_task


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="builtin:testbed-sft",
                   help="model directory, or builtin:testbed-sft (default: the shipped testbed SFT model)")
    p.add_argument("--task", default="gym:train", help="a taut task spec (gym:train, gym:add, …)")
    p.add_argument("--problems-per-level", type=int, default=8)
    p.add_argument("--tau", type=float, default=1.0, help="gate: group pass rate at least tau")
    p.add_argument("--slack", type=float, default=0.0)
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--max-penalty", type=float, default=0.5)
    p.add_argument("--max-completion-length", type=int, default=64)
    p.add_argument("--siri", action="store_true", help="also cap rollouts with a cosine SIRI schedule")
    p.add_argument("--l-min", type=int, default=24, help="SIRI's lowest cap (with --siri)")
    p.add_argument("--period", type=int, default=4, help="SIRI's cycle in steps (with --siri)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--per-device-batch", type=int, default=8, help="completions per process and step")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--vllm-mode", choices=["colocate", "server"], default=None,
                   help="generate with vLLM (GPU only; not exercised by taut's CPU tests)")
    p.add_argument("--output-dir", default="runs/trl-mastery")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    on_gpu = torch.cuda.is_available()
    policy = load_policy(ModelConfig(path=args.model, device="cpu", dtype="float32"), seed=args.seed)   # the trainer places it
    task = load_task(args.task)
    dataset = problems_dataset(task.problems("train", args.problems_per_level, seed=args.seed),
                               conversational=policy.chat)

    mastery = MasteryGatedConfig(tau=args.tau, slack=args.slack, alpha=args.alpha, max_penalty=args.max_penalty)
    schedule = (SiriConfig(l_max=args.max_completion_length, l_min=args.l_min, period=args.period)
                if args.siri else mastery)
    config = GRPOConfig(
        output_dir=args.output_dir,
        use_cpu=not on_gpu, bf16=on_gpu, gradient_checkpointing=False, report_to="none",
        use_vllm=args.vllm_mode is not None, vllm_mode=args.vllm_mode or "colocate",
        beta=0.0,
        num_generations=args.num_generations,
        per_device_train_batch_size=args.per_device_batch,
        max_completion_length=args.max_completion_length,
        max_steps=args.steps, learning_rate=args.lr, logging_steps=1, save_strategy="no", seed=args.seed,
    )
    reward = StrategyReward(
        mastery, TaskVerifier(args.task), schedule=schedule,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        eos_token_id=eos_token_ids(policy.model, policy.tokenizer),
        id_column="problem_id",                     # stable per-prompt key (use_best_seen memory)
    )
    trainer = GRPOTrainer(model=policy.model, reward_funcs=[reward], args=config, train_dataset=dataset,
                          processing_class=policy.tokenizer)
    # Sets the cap (constant without --siri) and checks the reward agrees with the trainer.
    trainer.add_callback(LengthCapCallback(trainer, schedule))
    trainer.train()
    trainer.save_model(args.output_dir)

    if torch.distributed.is_initialized():       # a clean exit under accelerate launch / torchrun
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

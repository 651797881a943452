"""Throughput: taut's trainer against TRL's GRPOTrainer on the identical workload.

Each measurement is a fresh worker process running one trainer for `warmup + steps` GRPO steps;
only the last `steps` are timed. Workers alternate A/B/A/B (the pair order flips every pair),
so slow phases of a shared machine hit both sides alike; the reported ratio is the median of
the per-pair ratios, with its min–max.

The workload, identical on both sides: the shipped testbed SFT model, the same prompts, 8
prompts × 8 completions per step, temperature 1, top-p 1, no top-k, the same maximum length,
the same torch thread count, one optimizer update per batch, token-mean loss with clip
0.2 / 0.28, group-normalised advantages, no KL, the testbed verifier as the reward. "natural"
lets completions end at `<eos>`; "forced" forbids `<eos>` until the maximum length.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Workload:
    model: str = "builtin:testbed-sft"
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 128
    forced: bool = False
    threads: int = 2
    steps: int = 5
    warmup: int = 1
    lr: float = 2e-4
    seed: int = 0
    # taut's own settings, for ablations of its optimisations (TRL ignores them)
    fast_decode: bool = True
    micro_batch_tokens: int = 2048


# ---------------------------------------------------------------------------------------------
# workers (one process each)
# ---------------------------------------------------------------------------------------------


def _prompts(w: Workload):
    from taut.tasks import load_task

    task = load_task("gym:train")
    return task, task.problems("train", 8, seed=w.seed)


def run_taut(w: Workload) -> dict[str, Any]:
    import torch

    from taut.config import RunConfig
    from taut.rl.trainer import train_rl
    from taut.runlog import read_metrics

    torch.set_num_threads(w.threads)
    config = RunConfig.model_validate({
        "seed": w.seed, "model": {"path": w.model, "threads": w.threads},
        "data": {"train": ["gym:train"], "pool_per_level": 8},
        "rl": {"steps": w.warmup + w.steps, "prompts_per_step": w.prompts_per_step, "group_size": w.group_size,
               "max_new_tokens": w.max_new_tokens, "min_new_tokens": w.max_new_tokens if w.forced else 0,
               "lr": w.lr, "dynamic_sampling": False, "checkpoint_every": 10**6,
               "fast_decode": w.fast_decode, "micro_batch_tokens": w.micro_batch_tokens},
    })
    with tempfile.TemporaryDirectory() as out:
        train_rl(config, Path(out), quiet=True)
        records = [r for r in read_metrics(Path(out)) if "event" not in r][w.warmup:]
    tokens = [r["length_mean"] * w.prompts_per_step * w.group_size for r in records]
    return _summary(
        step=[r["step_time"] for r in records], generation=[r["gen_time"] for r in records],
        rewards=[r["reward_time"] for r in records], logprobs=[r["logprob_time"] or 0.0 for r in records],
        update=[r["update_time"] for r in records], tokens=tokens,
    )


def run_trl(w: Workload) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from taut.config import ModelConfig
    from taut.models import load_policy

    torch.set_num_threads(w.threads)
    policy = load_policy(ModelConfig(path=w.model, threads=w.threads))
    task, problems = _prompts(w)
    by_prompt = {p.prompt: p for p in problems}

    eos = policy.eos_id

    def testbed_reward(prompts, completions, completion_ids, **kwargs):
        return [float(task.verify(by_prompt[p], c, complete=bool(ids) and ids[-1] == eos).correct)
                for p, c, ids in zip(prompts, completions, completion_ids)]

    testbed_reward.__name__ = "testbed"
    dataset = Dataset.from_list([{"prompt": p.prompt} for p in problems])
    gen_kwargs = {"min_new_tokens": w.max_new_tokens} if w.forced else {}
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=w.prompts_per_step * w.group_size,
        num_generations=w.group_size, max_completion_length=w.max_new_tokens, generation_kwargs=gen_kwargs,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28,
        scale_rewards="group", num_iterations=1, learning_rate=w.lr, lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
        max_steps=w.warmup + w.steps, logging_steps=1, save_strategy="no", report_to="none", bf16=False,
        gradient_checkpointing=False, use_cpu=True, disable_tqdm=True, seed=w.seed, shuffle_dataset=True,
    )
    trainer = GRPOTrainer(model=policy.model, reward_funcs=testbed_reward, args=args, train_dataset=dataset,
                          processing_class=policy.tokenizer)
    timers = {"generation": 0.0, "rewards": 0.0, "logprobs": 0.0}
    for name, attr in (("generation", "_generate"), ("rewards", "_calculate_rewards"),
                       ("logprobs", "_get_per_token_logps_and_entropies")):
        trainer.__dict__[attr] = _timed(getattr(trainer, attr), timers, name)   # instance attribute wraps the method
    rows: list[dict[str, float]] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            timers.update(dict.fromkeys(timers, 0.0))
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            rows.append({"step": time.perf_counter() - self.t0, **timers})

    trainer.add_callback(StepTimes())
    trainer.train()
    lengths = [entry["completions/mean_length"] for entry in trainer.state.log_history if "completions/mean_length" in entry]
    rows, lengths = rows[w.warmup:], lengths[w.warmup:]
    return _summary(
        step=[r["step"] for r in rows], generation=[r["generation"] for r in rows], rewards=[r["rewards"] for r in rows],
        logprobs=[r["logprobs"] for r in rows],
        update=[r["step"] - r["generation"] - r["rewards"] for r in rows],
        tokens=[n * w.prompts_per_step * w.group_size for n in lengths],
    )


def _timed(fn, timers: dict[str, float], name: str):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers[name] += time.perf_counter() - t0
    return wrapper


def _summary(*, step, generation, rewards, logprobs, update, tokens) -> dict[str, Any]:
    total = sum(step)
    return {
        "steps": len(step),
        "steps_per_s": len(step) / total,
        "rollout_tokens_per_s": sum(tokens) / total,
        "generation_tokens_per_s": sum(tokens) / max(sum(generation), 1e-9),
        "mean_completion_tokens": sum(tokens) / len(tokens) / 64 if tokens else 0.0,
        "split_s_per_step": {
            "generation": sum(generation) / len(step),
            "log-probs (forward)": sum(logprobs) / len(step),
            "backward + optimizer": max(0.0, (sum(update) - sum(logprobs)) / len(step)),
            "rewards": sum(rewards) / len(step),
        },
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def worker_main(argv: list[str]) -> None:
    side, workload_json, out = argv
    w = Workload(**json.loads(workload_json))
    result = {"taut": run_taut, "trl": run_trl}[side](w)
    Path(out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# the interleaved comparison
# ---------------------------------------------------------------------------------------------


def run_pair_series(w: Workload, pairs: int, sides=("taut", "trl"), log=print) -> dict[str, Any]:
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for i in range(pairs):
        order = sides if i % 2 == 0 else tuple(reversed(sides))
        for side in order:
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                t0 = time.perf_counter()
                cmd = [sys.executable, "-m", "taut.bench.speed", side, json.dumps(w.__dict__), f.name]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=_worker_env(w.threads))
                result = json.loads(Path(f.name).read_text())
            runs[side].append(result)
            log(f"  pair {i + 1}/{pairs} {side:5s} {result['steps_per_s']:.3f} steps/s "
                f"({result['mean_completion_tokens']:.0f} tokens/completion, {time.perf_counter() - t0:.0f} s wall)")
    out: dict[str, Any] = {"workload": w.__dict__, "runs": runs}
    if len(sides) == 2:
        a, b = sides
        ratios = [x["steps_per_s"] / y["steps_per_s"] for x, y in zip(runs[a], runs[b])]
        out["ratio"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "pairs": ratios}
    return out


def _worker_env(threads: int) -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


if __name__ == "__main__":
    worker_main(sys.argv[1:])

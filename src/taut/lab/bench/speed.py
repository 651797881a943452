"""Throughput: taut's trainer against TRL's GRPOTrainer on the identical workload.

Each measurement is a fresh worker process running one trainer for `warmup + steps` GRPO steps;
only the last `steps` are timed. Workers alternate A/B/A/B (the pair order flips every pair),
so slow phases of a shared machine hit both sides alike; the reported ratio is the median of
the per-pair ratios, with its min–max.

The workload, identical on both sides: the same model (the shipped testbed SFT model, or any
`model.path` such as the packaged SmolLM2-135M-Instruct) and task (the testbed's, or a
reasoning-gym task through the model's chat template), 8 prompts × 8 completions per step,
temperature 1, top-p 1, no top-k, the same maximum length, the same torch thread count and
precision (fp32, or fp32 weights under bf16 autocast), full fine-tuning or the same LoRA
adapters, one optimizer update per batch, token-mean loss with clip 0.2 / 0.28,
group-normalised advantages, no KL, the task's verifier as the reward, the same allocator
setting (both processes keep the memory torch frees: `taut.allocator`, applied by `load_policy`,
through which the TRL worker loads its model too). "natural" lets completions end at `<eos>`;
"forced" forbids `<eos>` until the maximum length.

Machine load is recorded around every pair (the 1-minute load average): a pair that ran with
more runnable processes than cores is flagged, since another job then shared its CPU time.
The matrix-product rate the machine reaches (torch, at the decode and training shapes of the
model) is measured in the same series, so that each step's time can be set against the least
its necessary arithmetic would take (`limits`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taut.config import RunConfig
from taut.models.loading import load_policy
from taut.rl.trainer import train_rl
from taut.runlog import read_metrics
from taut.tasks import load_task

# `--real`: one-digit additions, where SmolLM2-135M-Instruct samples right answers 34–53 % of the time,
# so groups have mixed rewards and both trainers update on every step
REAL_TASK = {"task": "reasoning-gym:basic_arithmetic", "answer_format": "answer-line",
             "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ["+"],
                        "allow_parentheses": False, "allow_negation": False, "format_style": "natural"}}


@dataclass(frozen=True)
class Workload:
    model: str = "builtin:testbed-sft"
    task: Any = "gym:train"           # a task spec as a recipe writes it (string or mapping)
    dtype: str = "float32"            # or "bf16-mixed": fp32 weights, bf16 autocast
    lora: bool = False                # the same LoRA adapters on both sides (taut's defaults)
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 128
    forced: bool = False
    threads: int = 2
    steps: int = 5
    warmup: int = 1
    lr: float = 2e-4
    seed: int = 0
    keep_freed_memory: bool = True          # a process setting, on both sides (taut.allocator)
    # taut's own settings, for ablations of its optimisations (TRL ignores them)
    fast_decode: bool = True
    micro_batch_tokens: int = 2048
    share_prompts: bool = True
    rollout_dtype: str = "auto"             # rl.rollout_dtype: bf16 generation over fp32 weights (taut's side only)


# ---------------------------------------------------------------------------------------------
# workers (one process each)
# ---------------------------------------------------------------------------------------------


def _config(w: Workload):
    """taut's run configuration for the workload; the TRL side takes its model, task and LoRA
    settings from it too, so that both sides train the same thing."""
    return RunConfig.model_validate({
        "seed": w.seed,
        "model": {"path": w.model, "threads": w.threads, "dtype": w.dtype, "keep_freed_memory": w.keep_freed_memory,
                  **({"lora": {}} if w.lora else {})},
        "data": {"train": [w.task], "pool_per_level": 8},
        "rl": {"steps": w.warmup + w.steps, "prompts_per_step": w.prompts_per_step, "group_size": w.group_size,
               "max_new_tokens": w.max_new_tokens, "min_new_tokens": w.max_new_tokens if w.forced else 0,
               "lr": w.lr, "dynamic_sampling": False, "checkpoint_every": 10**6,
               "fast_decode": w.fast_decode, "micro_batch_tokens": w.micro_batch_tokens,
               "share_prompts": w.share_prompts, "rollout_dtype": w.rollout_dtype},
    })


def _prompts(w: Workload):
    task = load_task(_config(w).data.train[0])
    return task, task.problems("train", 8, seed=w.seed)


def run_taut(w: Workload) -> dict[str, Any]:
    import torch

    torch.set_num_threads(w.threads)
    config = _config(w)
    with tempfile.TemporaryDirectory() as out:
        train_rl(config, Path(out), quiet=True)
        records = [r for r in read_metrics(Path(out)) if "event" not in r][w.warmup:]
    rows = w.prompts_per_step * w.group_size
    return _summary(
        step=[r["step_time"] for r in records], generation=[r["gen_time"] for r in records],
        rewards=[r["reward_time"] for r in records], logprobs=[r["logprob_time"] or 0.0 for r in records],
        update=[r["update_time"] for r in records], tokens=[r["length_mean"] * rows for r in records],
        accuracy=[r["accuracy"] for r in records], rows=rows,
    ) | {"rows_trained": sum(r.get("rows_trained") or 0 for r in records) / len(records) / rows,
         "prompts_forwarded": sum(r.get("prompts_forwarded") or 0 for r in records) / len(records) / rows,
         "rollout_dtype": config.rl.rollout_dtype}


def run_trl(w: Workload) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(w.threads)
    config = _config(w)
    policy = load_policy(config.model.model_copy(update={"lora": None, "dtype": "float32"}))  # TRL applies both
    task, problems = _prompts(w)
    by_prompt = {p.prompt: p for p in problems}
    eos = policy.eos_id

    def prompt_text(prompt) -> str:
        return prompt[-1]["content"] if isinstance(prompt, list) else prompt

    def task_reward(prompts, completions, completion_ids, **kwargs):
        out = []
        for p, c, ids in zip(prompts, completions, completion_ids):
            text = c[-1]["content"] if isinstance(c, list) else c
            out.append(float(task.verify(by_prompt[prompt_text(p)], text, complete=bool(ids) and ids[-1] == eos).correct))
        return out

    task_reward.__name__ = "task"
    # chat models get the prompt as a conversation, so that TRL applies the same chat template
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p.prompt}] if policy.chat else p.prompt}
                                 for p in problems])
    peft_config = None
    if config.model.lora is not None:
        from peft import LoraConfig

        lora = config.model.lora
        peft_config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                 target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    gen_kwargs = {"min_new_tokens": w.max_new_tokens} if w.forced else {}
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=w.prompts_per_step * w.group_size,
        num_generations=w.group_size, max_completion_length=w.max_new_tokens, generation_kwargs=gen_kwargs,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, loss_type="dapo", epsilon=0.2, epsilon_high=0.28,
        scale_rewards="group", num_iterations=1, learning_rate=w.lr, lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
        max_steps=w.warmup + w.steps, logging_steps=1, save_strategy="no", report_to="none", bf16=w.dtype == "bf16-mixed",
        gradient_checkpointing=False, use_cpu=True, disable_tqdm=True, seed=w.seed, shuffle_dataset=True,
    )
    trainer = GRPOTrainer(model=policy.model, reward_funcs=task_reward, args=args, train_dataset=dataset,
                          processing_class=policy.tokenizer, peft_config=peft_config)
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
    logged = [entry for entry in trainer.state.log_history if "completions/mean_length" in entry][w.warmup:]
    rows = rows[w.warmup:]
    n = w.prompts_per_step * w.group_size
    return _summary(
        step=[r["step"] for r in rows], generation=[r["generation"] for r in rows], rewards=[r["rewards"] for r in rows],
        logprobs=[r["logprobs"] for r in rows],
        update=[r["step"] - r["generation"] - r["rewards"] for r in rows],
        tokens=[entry["completions/mean_length"] * n for entry in logged],
        accuracy=[entry.get("rewards/task/mean", float("nan")) for entry in logged], rows=n,
    ) | {"rows_trained": 1.0, "prompts_forwarded": 1.0}          # TRL forwards every row with its prompt


def _timed(fn, timers: dict[str, float], name: str):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers[name] += time.perf_counter() - t0
    return wrapper


def _summary(*, step, generation, rewards, logprobs, update, tokens, accuracy, rows) -> dict[str, Any]:
    total = sum(step)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "steps": len(step),
        "steps_per_s": len(step) / total,
        "rollout_tokens_per_s": sum(tokens) / total,
        "generation_tokens_per_s": sum(tokens) / max(sum(generation), 1e-9),
        "mean_completion_tokens": sum(tokens) / len(tokens) / rows if tokens else 0.0,
        "accuracy": sum(accuracy) / len(accuracy) if accuracy else float("nan"),
        "split_s_per_step": {
            "generation": sum(generation) / len(step),
            "log-probs (forward)": sum(logprobs) / len(step),
            "backward + optimizer": max(0.0, (sum(update) - sum(logprobs)) / len(step)),
            "rewards": sum(rewards) / len(step),
        },
        "peak_rss_mb": usage.ru_maxrss / 1024,
        # the whole worker process, warm-up included: time the kernel spent for it (mostly page
        # faults when memory is given back and taken again: taut.allocator) and the faults
        "process_system_cpu_s": usage.ru_stime,
        "process_page_faults": usage.ru_minflt + usage.ru_majflt,
    }


# ---------------------------------------------------------------------------------------------
# the machine's limit: matrix-product rates and the step's necessary arithmetic
# ---------------------------------------------------------------------------------------------


def model_shapes(w: Workload) -> dict[str, Any]:
    """The weight matrices a forward pass multiplies by (the LM head included, embeddings'
    lookups not) and the mean prompt length of the workload's prompts."""
    import torch

    policy = load_policy(_config(w).model.model_copy(update={"lora": None}))
    shapes = [tuple(m.weight.shape) for m in policy.model.modules()
              if isinstance(m, torch.nn.Linear)]
    _, problems = _prompts(w)
    prompt_tokens = statistics.mean(len(policy.encode_prompt(p.prompt)) for p in problems)
    return {"shapes": shapes, "params": sum(o * i for o, i in shapes), "prompt_tokens": prompt_tokens}


def matmul_rates(shapes: list[tuple[int, int]], rows: dict[str, int], threads: int, seconds: float = 0.5) -> dict[str, float]:
    """GFLOP/s that torch reaches here for the model's weight shapes, per precision and phase:
    `decode` multiplies `rows["decode"]` rows (one token per rollout), `train` a micro-batch of
    `rows["train"]` tokens. The rate over all shapes is the FLOP-weighted one (total FLOPs over
    total time), as a forward pass spends it. In bf16 on a CPU with oneDNN each shape is also
    timed with its weight reordered once into oneDNN's layout (`torch.ops.mkldnn`, as taut's
    decode path runs it), and the faster of the two counts: at one row per rollout the reorder
    that a plain product repeats at every call is a large part of its time."""
    import torch

    torch.set_num_threads(threads)
    out = {}
    distinct = sorted(set(shapes))
    for dtype in (torch.float32, torch.bfloat16):
        for phase, m in rows.items():
            flops = seconds_total = 0.0
            for n, k in distinct:
                x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
                best = min(_seconds_per_call(product, seconds / len(distinct)) for product in _products(x, w))
                count = shapes.count((n, k))
                flops += count * 2 * m * n * k
                seconds_total += count * best
            out[f"{phase} {'bf16' if dtype == torch.bfloat16 else 'fp32'}"] = flops / seconds_total / 1e9
    return out


def _products(x, w) -> list:
    """The ways torch multiplies x · wᵀ here: a plain product, and in bf16 with oneDNN the
    product against the weight reordered once (the prepacked form; same values)."""
    import torch

    products = [lambda: torch.nn.functional.linear(x, w)]
    if w.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(w, x.shape[0])
        products.append(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
    return products


def _seconds_per_call(product, seconds: float) -> float:
    product()                                                              # warm-up
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or reps < 3:
        product()
        reps += 1
    return (time.perf_counter() - t0) / reps


def limits(run: dict[str, Any], w: Workload, model: dict[str, Any], rates: dict[str, float]) -> dict[str, float]:
    """The share of the machine's limit a run reached, per phase: the phase's arithmetic (2·N
    FLOPs per generated token; per trained token — prompt and completion of each row the update
    forwards — 6·N for full fine-tuning, 4·N with LoRA, whose frozen weights need no gradient)
    at the bf16 matrix-product rate of that phase's shapes, over the time the phase took. taut
    skips rows of zero advantage (`rows_trained` < 1) and forwards a prompt once for the rows of a
    micro-batch that share it (`prompts_forwarded` < 1), so its update is measured on the tokens
    it trains."""
    n, rows = model["params"], w.prompts_per_step * w.group_size
    generated = run["mean_completion_tokens"] * rows
    trained = rows * (run["mean_completion_tokens"] * run.get("rows_trained", 1.0)
                      + model["prompt_tokens"] * run.get("prompts_forwarded", run.get("rows_trained", 1.0)))
    split = run["split_s_per_step"]
    gen_ideal = 2 * n * generated / (rates["decode bf16"] * 1e9)
    train_ideal = (4 if w.lora else 6) * n * trained / (rates["train bf16"] * 1e9)
    update_time = split["log-probs (forward)"] + split["backward + optimizer"]
    return {"generation": gen_ideal / max(split["generation"], 1e-9), "update": train_ideal / max(update_time, 1e-9),
            "step": (gen_ideal + train_ideal) * run["steps_per_s"]}


def run_limits(w: Workload) -> dict[str, Any]:
    model = model_shapes(w)
    rows = {"decode": w.prompts_per_step * w.group_size, "train": min(w.micro_batch_tokens, 4096)}
    return {"model": model, "rates_gflops": matmul_rates(model["shapes"], rows, w.threads)}


def worker_main(argv: list[str]) -> None:
    side, workload_json, out = argv
    w = Workload(**json.loads(workload_json))
    result = {"taut": run_taut, "trl": run_trl, "limits": run_limits}[side](w)
    Path(out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# the interleaved comparison
# ---------------------------------------------------------------------------------------------


# taut's side of a series for each rl.rollout_dtype: a side of its own, so that both precisions run
# against the same TRL runs (TRL generates in the precision it trains in)
ROLLOUT_SIDES = {"auto": "taut", "bf16": "taut+bf16-rollouts"}


def worker(side: str, w: Workload) -> dict[str, Any]:
    for dtype, label in ROLLOUT_SIDES.items():
        if side == label:
            side, w = "taut", dataclasses.replace(w, rollout_dtype=dtype)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [sys.executable, "-m", "taut.lab.bench.speed", side, json.dumps(w.__dict__), f.name]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=_worker_env(w.threads))
        return json.loads(Path(f.name).read_text())


def load() -> float:
    """The 1-minute load average: runnable processes, averaged."""
    return os.getloadavg()[0]


def run_pair_series(w: Workload, pairs: int, sides=("taut", "trl"), log=print, with_limits: bool = True,
                    before_rates: dict[str, float] | None = None) -> dict[str, Any]:
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    cores = os.cpu_count() or 1
    loads = []
    for i in range(pairs):
        order = sides if i % 2 == 0 else tuple(reversed(sides))
        before = load()
        for side in order:
            t0 = time.perf_counter()
            result = worker(side, w)
            runs[side].append(result)
            log(f"  pair {i + 1}/{pairs} {side:5s} {result['steps_per_s']:.3f} steps/s "
                f"({result['mean_completion_tokens']:.0f} tokens/completion, {time.perf_counter() - t0:.0f} s wall)")
        after = load()
        loads.append({"before": before, "after": after, "loaded": max(before, after) > cores})
        if loads[-1]["loaded"]:
            log(f"  pair {i + 1}: load {before:.1f} → {after:.1f} on {cores} cores: another job shared this pair's CPU")
    out: dict[str, Any] = {"workload": w.__dict__, "runs": runs, "load": loads, "cores": cores}
    if len(sides) >= 2:
        # each side against the last (the comparison tool): medians of per-pair ratios; `ratio` is the first side's
        out["ratios"] = {}
        for a in sides[:-1]:
            ratios = [x["steps_per_s"] / y["steps_per_s"] for x, y in zip(runs[a], runs[sides[-1]])]
            out["ratios"][a] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "pairs": ratios}
        out["ratio"] = out["ratios"][sides[0]]
    if with_limits:
        # the machine's limit is the best rate it reaches: measured after the series and, when
        # given, before it too (a rate measured while memory is still being reclaimed is low)
        measured = worker("limits", w)
        if before_rates:
            measured["rates_gflops"] = {k: max(v, before_rates[k]) for k, v in measured["rates_gflops"].items()}
        out["limits"] = measured
        for side in sides:
            for run in runs[side]:
                run["limit_fraction"] = limits(run, w, measured["model"], measured["rates_gflops"])
    return out


def _worker_env(threads: int) -> dict[str, str]:
    import os

    return {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


if __name__ == "__main__":
    worker_main(sys.argv[1:])

